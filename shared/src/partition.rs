//! The canonical split of M chains over d devices (PROTOCOL.md "Partition").

use thiserror::Error;

/// Most devices one commitment may name.
pub const MAX_DEVICES: u32 = 64;

/// One device's contiguous share of the chains: global indices `offset..offset + count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceSlice {
    /// The device's position, 0-based, in ascending CUDA ordinal order (after CUDA_VISIBLE_DEVICES).
    pub index: u32,
    pub offset: u64,
    pub count: u64,
}

impl DeviceSlice {
    pub fn chains(&self) -> std::ops::Range<u64> {
        self.offset..self.offset + self.count
    }

    pub fn contains(&self, chain: u64) -> bool {
        self.chains().contains(&chain)
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("device count {0} is outside 1..={MAX_DEVICES}")]
pub struct DeviceCountError(pub u32);

/// Device j gets `M/d + (j < M % d)` chains, starting where device j-1's end.
pub fn canonical_partition(num_chains: u64, devices: u32) -> Result<Vec<DeviceSlice>, DeviceCountError> {
    if !(1..=MAX_DEVICES).contains(&devices) {
        return Err(DeviceCountError(devices));
    }
    let d = u64::from(devices);
    let (base, rem) = (num_chains / d, num_chains % d);
    let mut offset = 0;
    Ok((0..devices)
        .map(|index| {
            let count = base + u64::from(u64::from(index) < rem);
            let slice = DeviceSlice { index, offset, count };
            offset += count;
            slice
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remainder_goes_to_the_first_devices() {
        let p = canonical_partition(10, 4).unwrap();
        let shape: Vec<_> = p.iter().map(|s| (s.index, s.offset, s.count)).collect();
        assert_eq!(shape, vec![(0, 0, 3), (1, 3, 3), (2, 6, 2), (3, 8, 2)]);
    }

    #[test]
    fn more_devices_than_chains_leaves_some_empty() {
        let p = canonical_partition(2, 3).unwrap();
        assert_eq!(p.iter().map(|s| s.count).collect::<Vec<_>>(), vec![1, 1, 0]);
        assert_eq!(p[2].offset, 2);
    }

    #[test]
    fn rejects_zero_and_too_many_devices() {
        assert_eq!(canonical_partition(4, 0), Err(DeviceCountError(0)));
        assert_eq!(
            canonical_partition(4, MAX_DEVICES + 1),
            Err(DeviceCountError(MAX_DEVICES + 1))
        );
    }
}
