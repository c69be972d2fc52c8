//! The binary BLAKE3 Merkle tree over one device's chain leaves (PROTOCOL.md "Device root").
//!
//! Leaf node `blake3(0x00 || leaf)`, inner node `blake3(0x01 || left || right)`: the prefixes
//! keep a leaf from ever being read as an inner node. A level with an odd count promotes its last
//! node unchanged, so a proof skips that level and its shape depends on (index, count) alone.

use crate::digest::Digest;
use thiserror::Error;

const EMPTY_CONTEXT: &[u8] = b"gpu-attest v1 empty";

/// The root of a device that was given no chains.
pub fn empty_root() -> Digest {
    Digest::hash(EMPTY_CONTEXT)
}

pub fn leaf_node(leaf: &Digest) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(&[0x00]);
    h.update(leaf.as_bytes());
    h.finalize().into()
}

pub fn inner_node(left: &Digest, right: &Digest) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(&[0x01]);
    h.update(left.as_bytes());
    h.update(right.as_bytes());
    h.finalize().into()
}

/// A whole tree, every level kept so that proofs can be cut from it.
#[derive(Clone, Debug)]
pub struct MerkleTree {
    /// levels[0] are the leaf nodes; the last level holds the root alone.
    levels: Vec<Vec<Digest>>,
}

/// The siblings from a leaf up to the root, bottom first, skipping promoted levels.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MerkleProof {
    pub siblings: Vec<Digest>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProofError {
    #[error("leaf index {index} is outside a tree of {count} leaves")]
    IndexOutOfRange { index: u64, count: u64 },
    #[error("proof has {got} siblings, a tree of {count} leaves needs {want} at index {index}")]
    WrongLength {
        index: u64,
        count: u64,
        got: usize,
        want: usize,
    },
    #[error("proof does not lead to the committed root")]
    RootMismatch,
}

impl MerkleTree {
    pub fn new(leaves: &[Digest]) -> Self {
        Self::over_nodes(leaves.iter().map(leaf_node).collect())
    }

    /// The tree whose bottom level is `nodes`, already nodes rather than leaves: the upper
    /// levels of a larger tree, given the roots of its aligned subtrees of `2^h` leaves (the
    /// last one possibly smaller). With the odd node promoted at every level, node `k` at
    /// level `h` is exactly the root of the leaves `k * 2^h ..`, so these levels and their
    /// proofs are the larger tree's.
    pub fn over_nodes(nodes: Vec<Digest>) -> Self {
        let mut levels = vec![nodes];
        while levels.last().is_some_and(|l| l.len() > 1) {
            let below = levels.last().expect("non-empty");
            let above = below
                .chunks(2)
                .map(|pair| match pair {
                    [l, r] => inner_node(l, r),
                    [only] => *only,
                    _ => unreachable!("chunks(2)"),
                })
                .collect();
            levels.push(above);
        }
        MerkleTree { levels }
    }

    pub fn leaf_count(&self) -> u64 {
        self.levels[0].len() as u64
    }

    pub fn root(&self) -> Digest {
        match self.levels.last().and_then(|l| l.first()) {
            Some(root) => *root,
            None => empty_root(),
        }
    }

    /// The proof for the leaf at `index`; `None` if there is no such leaf.
    pub fn proof(&self, index: u64) -> Option<MerkleProof> {
        if index >= self.leaf_count() {
            return None;
        }
        let mut pos = index as usize;
        let mut siblings = Vec::new();
        for level in &self.levels[..self.levels.len() - 1] {
            let sibling = pos ^ 1;
            if sibling < level.len() {
                siblings.push(level[sibling]);
            }
            pos /= 2;
        }
        Some(MerkleProof { siblings })
    }
}

/// The root over `leaves`, without keeping the tree.
pub fn root_of(leaves: &[Digest]) -> Digest {
    MerkleTree::new(leaves).root()
}

/// Checks that `leaf` sits at `index` of a tree of `count` leaves whose root is `root`.
pub fn verify_proof(
    root: &Digest,
    leaf: &Digest,
    index: u64,
    count: u64,
    proof: &MerkleProof,
) -> Result<(), ProofError> {
    if index >= count {
        return Err(ProofError::IndexOutOfRange { index, count });
    }
    let want = sibling_sides(index, count).count();
    if proof.siblings.len() != want {
        return Err(ProofError::WrongLength {
            index,
            count,
            got: proof.siblings.len(),
            want,
        });
    }
    let node = proof
        .siblings
        .iter()
        .zip(sibling_sides(index, count))
        .fold(leaf_node(leaf), |node, (sibling, left)| {
            if left {
                inner_node(sibling, &node)
            } else {
                inner_node(&node, sibling)
            }
        });
    if node == *root {
        Ok(())
    } else {
        Err(ProofError::RootMismatch)
    }
}

impl MerkleProof {
    /// The siblings that lie left of leaf `index`'s path in a tree of `count` leaves, lowest
    /// first: the roots of the perfect subtrees that together hold exactly the leaves before
    /// `index`, one for each set bit of `index`. Read from a proof of the right length (as
    /// [`verify_proof`] checks it); a shorter proof gives what it has.
    pub fn left_siblings(&self, index: u64, count: u64) -> Vec<Digest> {
        self.siblings
            .iter()
            .zip(sibling_sides(index, count))
            .filter(|(_, left)| *left)
            .map(|(sibling, _)| *sibling)
            .collect()
    }
}

/// The root of [`MerkleTree`] over leaves that arrive one at a time, with at most 64 nodes held:
/// what a walker needs to commit to every one of its states without keeping them (a walk's trace
/// is far larger than its tree's right edge).
///
/// Why it equals the tree: level-by-level pairing with the odd node promoted splits `count`
/// leaves into perfect subtrees of the sizes of `count`'s set bits, largest first, and joins them
/// from the right. The fold keeps one finished subtree per set bit of the count so far, merges
/// equal sizes as they meet, and joins what is left from the right in [`MerkleFold::root`].
#[derive(Clone, Debug, Default)]
pub struct MerkleFold {
    /// Finished perfect subtrees, largest (oldest) first, with their heights.
    pending: Vec<(u32, Digest)>,
    count: u64,
}

impl MerkleFold {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, leaf: &Digest) {
        let mut node = (0, leaf_node(leaf));
        while let Some(&(height, left)) = self.pending.last() {
            if height != node.0 {
                break;
            }
            self.pending.pop();
            node = (height + 1, inner_node(&left, &node.1));
        }
        self.pending.push(node);
        self.count += 1;
    }

    pub fn leaf_count(&self) -> u64 {
        self.count
    }

    /// The nodes left of the next leaf's path, lowest first: every finished subtree, which is
    /// what [`MerkleProof::left_siblings`] reads from that leaf's proof once the tree is whole.
    pub fn left_siblings(&self) -> Vec<Digest> {
        self.pending.iter().rev().map(|(_, node)| *node).collect()
    }

    /// The root over every leaf pushed so far; [`empty_root`] if none.
    pub fn root(&self) -> Digest {
        let mut nodes = self.pending.iter().rev().map(|(_, node)| *node);
        match nodes.next() {
            None => empty_root(),
            Some(last) => nodes.fold(last, |right, left| inner_node(&left, &right)),
        }
    }
}

/// The levels of leaf `index`'s path in a tree of `count` leaves that have a sibling, bottom
/// first (a promoted level has none), each as whether the sibling lies left: one item per
/// sibling of the leaf's proof, so its length, its check and its left siblings read alike.
fn sibling_sides(index: u64, count: u64) -> impl Iterator<Item = bool> {
    let mut level = (index, count);
    std::iter::from_fn(move || {
        while level.1 > 1 {
            let (pos, len) = level;
            level = (pos / 2, len.div_ceil(2));
            if pos ^ 1 < len {
                return Some(pos % 2 == 1);
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(count: usize) -> Vec<Digest> {
        (0..count).map(|i| Digest::hash(&(i as u64).to_le_bytes())).collect()
    }

    #[test]
    fn small_trees_by_hand() {
        let l = leaves(3);
        let (n0, n1, n2) = (leaf_node(&l[0]), leaf_node(&l[1]), leaf_node(&l[2]));
        assert_eq!(root_of(&l[..1]), n0);
        assert_eq!(root_of(&l[..2]), inner_node(&n0, &n1));
        // Three leaves: the third is promoted past level one.
        assert_eq!(root_of(&l), inner_node(&inner_node(&n0, &n1), &n2));
        assert_eq!(root_of(&[]), empty_root());
    }

    #[test]
    fn the_fold_gives_the_tree_root_at_every_count() {
        let l = leaves(70);
        let mut fold = MerkleFold::new();
        assert_eq!(fold.root(), empty_root());
        for (count, leaf) in l.iter().enumerate() {
            fold.push(leaf);
            assert_eq!(fold.root(), root_of(&l[..=count]), "after {} leaves", count + 1);
        }
        assert_eq!(fold.leaf_count(), 70);
        // 70 = 64 + 4 + 2: three subtrees held, not 70 leaves.
        assert_eq!(fold.pending.len(), 3);
    }

    /// Leaf `i`'s left siblings, read from its proof in a tree of any size, are the fold's
    /// finished subtrees after `i` leaves: the roots over leaves `0 .. i`, one per set bit of
    /// `i`, lowest first. (What the locality walk's next generation starts from.)
    #[test]
    fn the_left_siblings_of_a_leaf_are_the_subtrees_before_it() {
        let l = leaves(23);
        let mut fold = MerkleFold::new();
        for i in 0..l.len() {
            let left = fold.left_siblings();
            assert_eq!(left.len(), (i as u64).count_ones() as usize, "leaf {i}");
            // Lowest first: the lowest set bit's subtree ends just before leaf i.
            let mut end = i;
            for (k, node) in left.iter().enumerate() {
                let size = 1usize << (end.trailing_zeros());
                let subtree = MerkleTree::new(&l[end - size..end]).root();
                assert_eq!(*node, subtree, "leaf {i}, left sibling {k}");
                end -= size;
            }
            assert_eq!(end, 0, "leaf {i}: the left siblings cover every earlier leaf");
            for count in i + 1..=l.len() {
                let tree = MerkleTree::new(&l[..count]);
                let proof = tree.proof(i as u64).unwrap();
                assert_eq!(proof.left_siblings(i as u64, count as u64), left, "leaf {i} of {count}");
            }
            fold.push(&l[i]);
        }
    }

    #[test]
    fn promoted_leaf_has_shorter_proof() {
        let tree = MerkleTree::new(&leaves(5));
        assert_eq!(tree.proof(4).unwrap().siblings.len(), 1);
        assert_eq!(tree.proof(0).unwrap().siblings.len(), 3);
        assert!(tree.proof(5).is_none());
    }
}
