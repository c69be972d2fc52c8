//! The attestation transcript file (PROTOCOL.md 21.1): a `Transcript`'s bytes signed by the
//! validator, sealed and opened again. Here, beside the wire types, so that a validator writes
//! it, and a miner or an auditor of any kind reads it, the same way.

use crate::v1;
use gpu_attest_shared::keys::{KeyPair, PublicKey};
use prost::Message;
use sha2::{Digest, Sha256};

/// The transcript format this release writes: 3 records version 3's walk and its openings' rows,
/// 2 the challenge stream (PROTOCOL.md 21.2).
pub const FORMAT: u32 = 3;

/// The first format that records version 3's walk: an earlier one's is taken as stated.
pub const FORMAT_WITH_VERSION_3_WALK: u32 = 3;

/// The oldest format this release reads: 1, without the stream.
pub const OLDEST_FORMAT: u32 = 1;

/// What the validator's signature covers comes after this (PROTOCOL.md 21.1).
const DOMAIN: &[u8] = b"gpu-attest v1 transcript";

/// A transcript file's largest size this release reads or keeps: under 2 GiB, the most that
/// protobuf's own implementations read as one message, so that an auditor of any kind can read
/// every file a validator keeps. One H200's verdict at first contact was 165.7 MB (16 start
/// matrices of 4 MiB, and 1298 opened steps at about 76 KB each, most of it the 64 KiB slice the
/// step read), so this holds a first-contact verdict of about 15 devices opened at the 1649-step
/// cap with 16 chain samples at n = 2048; a larger one is not kept (PROTOCOL.md 21.1).
pub const MAX_TRANSCRIPT_BYTES: usize = i32::MAX as usize;

/// What a signed file holds besides its transcript's bytes, at most: the key, the signature and
/// three fields' headers.
const SEAL_OVERHEAD: usize = 128;

/// The most elements a transcript's repeated messages may hold, each list counted before the
/// transcript is decoded: a decoded element takes up to a few hundred times the two bytes it
/// can be encoded in, so a hostile file of short elements is refused, not decoded. Far above the
/// 1298 to 1649 steps a device opens at first contact; a verdict past it is not kept
/// ([`seal_readable`]).
pub const MAX_ELEMENTS: usize = 1 << 16;

/// What decoding a transcript may cost, estimated on its bytes before it is decoded, beyond the
/// file's own size: every field at every depth costs [`FIELD_COST`] (a vector's slot, a byte
/// string's header), a nested message [`MESSAGE_COST`] more (its struct), a packed list 8 bytes
/// a byte, and the total may reach the transcript's own size and this much more. A verdict's
/// transcript costs under its size where its steps' slices differ (a CPU verdict's 24.2 MB file
/// 15.6 MB, some 9.4 KB an opened step beside the step's 64 KiB slice) and about 3 KB a step
/// over it where they repeat (each kept once), which this floor covers for some 80000 steps;
/// a hostile file of empty entries costs 16 to 528 times its size, so it is refused before its
/// decoded entries pass its size and this.
pub const MAX_DECODING_COST: u64 = 256 << 20;
/// The estimated cost of one decoded field.
const FIELD_COST: u64 = 32;
/// The estimated cost of one decoded nested message beyond its fields: the largest struct a
/// transcript holds (a chain opening with its step and walk openings inline) is under this.
const MESSAGE_COST: u64 = 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TranscriptError {
    #[error("not a gpu-attest transcript: {0}")]
    NotATranscript(String),
    #[error("the transcript is {got} bytes; this release reads at most {MAX_TRANSCRIPT_BYTES}")]
    TooLarge { got: usize },
    #[error("the transcript's {what} hold more than {MAX_ELEMENTS} entries: not a verdict's")]
    TooMany { what: &'static str },
    #[error(
        "the transcript's entries would take more than its own size and {} MiB to decode: not a verdict's",
        MAX_DECODING_COST >> 20
    )]
    TooCostly,
    #[error(
        "transcript format {found}: this release reads formats {OLDEST_FORMAT} to {FORMAT} (a newer validator wrote it; audit it with a release as new)"
    )]
    Format { found: u32 },
}

/// The bytes the validator signs for a transcript whose encoding is `transcript`: the domain,
/// then SHA-256 of those bytes (so that an auditor can hash a large file as it reads it).
pub fn signing_bytes(transcript: &[u8]) -> Vec<u8> {
    let mut out = DOMAIN.to_vec();
    out.extend_from_slice(&Sha256::digest(transcript));
    out
}

/// Encodes `transcript` and signs it with `validator`: the file's bytes.
pub fn seal(transcript: &v1::Transcript, validator: &KeyPair) -> Vec<u8> {
    wrap(transcript.encode_to_vec(), validator)
}

/// [`seal`], where a reader of this release would open the file: within
/// [`MAX_TRANSCRIPT_BYTES`], [`MAX_ELEMENTS`] and [`MAX_DECODING_COST`], checked on the encoded
/// bytes as [`open`] checks them. A validator keeps only such files: one that no reader opens
/// would promise an audit that cannot run.
pub fn seal_readable(transcript: &v1::Transcript, validator: &KeyPair) -> Result<Vec<u8>, TranscriptError> {
    let bytes = transcript.encode_to_vec();
    let file = bytes.len().saturating_add(SEAL_OVERHEAD);
    if file > MAX_TRANSCRIPT_BYTES {
        return Err(TranscriptError::TooLarge { got: file });
    }
    within_limits(&bytes)?;
    Ok(wrap(bytes, validator))
}

/// The checks [`open`] makes on a transcript's bytes before decoding them: the lists' counts and
/// the decoding's estimated cost.
fn within_limits(transcript: &[u8]) -> Result<(), TranscriptError> {
    within_limits_at(transcript, MAX_DECODING_COST)
}

/// [`within_limits`] with the decoding cost's floor at `floor`.
fn within_limits_at(transcript: &[u8], floor: u64) -> Result<(), TranscriptError> {
    check_counts(transcript)?;
    let mut cost = 0;
    decoding_cost(transcript, TRANSCRIPT, &mut cost, floor + transcript.len() as u64)
}

/// The signed file around a transcript's encoded bytes.
fn wrap(bytes: Vec<u8>, validator: &KeyPair) -> Vec<u8> {
    let signature = validator.sign(&signing_bytes(&bytes));
    v1::SignedTranscript {
        validator_key: validator.public_key().0.to_vec(),
        signature: signature.to_vec(),
        transcript: bytes,
    }
    .encode_to_vec()
}

/// A transcript file, decoded, with what its signature says. A signature that does not verify
/// still opens the file, so that an audit can name the part that changed.
#[derive(Debug)]
pub struct Opened {
    pub transcript: v1::Transcript,
    /// The key the file names as its signer; `None` when it is not 32 bytes of a key.
    pub signer: Option<PublicKey>,
    /// Whether the signature verifies with `signer` over the transcript's bytes as stored.
    pub signature_valid: bool,
}

/// Decodes a transcript file. Errors only when it cannot be read at all (not a transcript,
/// too large, of another format); a bad signature is for the caller to judge.
pub fn open(bytes: &[u8]) -> Result<Opened, TranscriptError> {
    if bytes.len() > MAX_TRANSCRIPT_BYTES {
        return Err(TranscriptError::TooLarge { got: bytes.len() });
    }
    let signed = v1::SignedTranscript::decode(bytes).map_err(|e| TranscriptError::NotATranscript(e.to_string()))?;
    if signed.transcript.is_empty() {
        return Err(TranscriptError::NotATranscript(
            "it holds no transcript (an empty file, or another kind of message)".into(),
        ));
    }
    within_limits(&signed.transcript)?;
    let transcript = v1::Transcript::decode(signed.transcript.as_slice())
        .map_err(|e| TranscriptError::NotATranscript(format!("the signed part does not decode: {e}")))?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&transcript.format) {
        return Err(TranscriptError::Format {
            found: transcript.format,
        });
    }
    let signer = <[u8; 32]>::try_from(signed.validator_key.as_slice())
        .ok()
        .map(PublicKey);
    let signature_valid = signer.is_some_and(|key| {
        key.verify(&signing_bytes(&signed.transcript), &signed.signature)
            .is_ok()
    });
    Ok(Opened {
        transcript,
        signer,
        signature_valid,
    })
}

/// What a field holds, for estimating a transcript's decoding cost before decoding it: a nested
/// message (walked into, with the fields of it that hold messages or packed lists), a packed
/// list of varints (one element a byte, at most), or anything else (one field).
#[derive(Clone, Copy)]
enum Shape {
    Message(&'static [(u32, Shape)]),
    Packed,
}

// The messages of transcript.proto, common.proto and miner.proto that hold others or lists,
// each with those fields (by number). Any field not listed costs one field.
const TRANSCRIPT: &[(u32, Shape)] = &[
    (4, Shape::Message(CHALLENGE)),
    (5, Shape::Message(&[(1, Shape::Message(COMMITMENT))])),
    (6, Shape::Message(RECORDED_WALK)),
    (7, Shape::Message(RECORDED_OPEN)),
    (10, Shape::Message(&[(3, Shape::Message(&[]))])),
    (11, Shape::Message(RECORDED_LOCALITY)),
];
const CHALLENGE: &[(u32, Shape)] = &[
    (1, Shape::Message(&[])),
    (7, Shape::Message(&[])),
    (9, Shape::Message(&[(3, Shape::Packed)])),
];
const COMMITMENT: &[(u32, Shape)] = &[
    (4, Shape::Message(&[])),
    (6, Shape::Message(&[])),
    (11, Shape::Message(&[])),
    (12, Shape::Message(&[])),
];
const RECORDED_WALK: &[(u32, Shape)] = &[
    (2, Shape::Message(&[(1, Shape::Message(&[]))])),
    (6, Shape::Message(&[(5, Shape::Message(&[]))])),
];
const RECORDED_OPEN: &[(u32, Shape)] = &[
    (
        1,
        Shape::Message(&[
            (2, Shape::Message(&[])),
            (5, Shape::Message(&[])),
            (6, Shape::Message(&[])),
        ]),
    ),
    (
        2,
        Shape::Message(&[(1, Shape::Message(CHAIN_OPENING)), (6, Shape::Packed)]),
    ),
    (5, Shape::Message(&[])),
];
const RECORDED_LOCALITY: &[(u32, Shape)] = &[
    (2, Shape::Message(&[])),
    (3, Shape::Message(&[(1, Shape::Message(&[]))])),
    (4, Shape::Message(&[])),
    (6, Shape::Message(&[(2, Shape::Message(&[]))])),
    (
        7,
        Shape::Message(&[
            (1, Shape::Message(&[(8, Shape::Message(&[]))])),
            (2, Shape::Message(&[])),
        ]),
    ),
];
const CHAIN_OPENING: &[(u32, Shape)] = &[
    (8, Shape::Message(&[(7, Shape::Message(&[]))])),
    (9, Shape::Message(&[])),
];

/// Adds to `cost` what decoding the message `buf` of shape `shape` would take, at every depth
/// the shape names; an error where `buf` is not a protobuf message or the cost passes `limit`.
fn decoding_cost(buf: &[u8], shape: &[(u32, Shape)], cost: &mut u64, limit: u64) -> Result<(), TranscriptError> {
    each_field(buf, |field, payload| {
        *cost += FIELD_COST;
        if let Some(payload) = payload {
            match shape.iter().find(|(tag, _)| *tag == field) {
                Some((_, Shape::Message(inner))) => {
                    *cost += MESSAGE_COST;
                    decoding_cost(payload, inner, cost, limit)?;
                }
                Some((_, Shape::Packed)) => *cost += 8 * payload.len() as u64,
                None => {}
            }
        }
        if *cost > limit {
            return Err(TranscriptError::TooCostly);
        }
        Ok(())
    })
}

/// The length-delimited fields numbered `tag` of the message `buf`, as slices of it (without
/// decoding them); an error where `buf` is not a protobuf message.
fn fields(buf: &[u8], tag: u32) -> Result<Vec<&[u8]>, TranscriptError> {
    let mut found = Vec::new();
    each_field(buf, |field, payload| {
        if let Some(payload) = payload.filter(|_| field == tag) {
            if found.len() >= MAX_ELEMENTS {
                return Err(TranscriptError::TooMany { what: "lists" });
            }
            found.push(payload);
        }
        Ok(())
    })?;
    Ok(found)
}

/// Calls `visit` with each field of the message `buf`, in order: its number, and its payload
/// where it is length-delimited. Nothing is decoded; an error where `buf` is not a protobuf
/// message (or `visit` gives one).
fn each_field<'a>(
    buf: &'a [u8],
    mut visit: impl FnMut(u32, Option<&'a [u8]>) -> Result<(), TranscriptError>,
) -> Result<(), TranscriptError> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let broken =
        |e: prost::DecodeError| TranscriptError::NotATranscript(format!("the signed part does not decode: {e}"));
    let short = || TranscriptError::NotATranscript("the signed part is cut short".into());
    let mut rest = buf;
    while !rest.is_empty() {
        let (field, wire) = decode_key(&mut rest).map_err(broken)?;
        let (payload, skip) = match wire {
            WireType::Varint => {
                decode_varint(&mut rest).map_err(broken)?;
                (None, 0)
            }
            WireType::SixtyFourBit => (None, 8),
            WireType::ThirtyTwoBit => (None, 4),
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut rest).map_err(broken)?).unwrap_or(usize::MAX);
                (Some(rest.get(..len).ok_or_else(short)?), len)
            }
            _ => return Err(TranscriptError::NotATranscript("the signed part holds a group".into())),
        };
        rest = rest.get(skip..).ok_or_else(short)?;
        visit(field, payload)?;
    }
    Ok(())
}

/// Refuses a transcript whose repeated messages hold more than [`MAX_ELEMENTS`] entries, counted
/// on its bytes before it is decoded (21.1).
fn check_counts(transcript: &[u8]) -> Result<(), TranscriptError> {
    // (field of Transcript, field within it, what it is)
    const LISTS: [(u32, u32, &str); 7] = [
        (7, 2, "openings"),
        (7, 5, "row checks"),
        (7, 6, "slices"),
        (6, 2, "walk roots"),
        (6, 5, "row-checked steps"),
        (5, 1, "commitments"),
        (10, 3, "stream reads"),
    ];
    for (outer, inner, what) in LISTS {
        for part in fields(transcript, outer)? {
            if fields(part, inner)?.len() >= MAX_ELEMENTS {
                return Err(TranscriptError::TooMany { what });
            }
        }
    }
    // Version 3's walk statement's roots.
    for walk in fields(transcript, 6)? {
        for statement in fields(walk, 6)? {
            if fields(statement, 5)?.len() >= MAX_ELEMENTS {
                return Err(TranscriptError::TooMany { what: "walk roots" });
            }
        }
    }
    // The commitment's own lists (devices, inventory, pools, evidence).
    for recorded in fields(transcript, 5)? {
        for commitment in fields(recorded, 1)? {
            for tag in [4, 6, 11, 12] {
                if fields(commitment, tag)?.len() >= MAX_ELEMENTS {
                    return Err(TranscriptError::TooMany {
                        what: "commitment's lists",
                    });
                }
            }
        }
    }
    Ok(())
}

/// A recorded opening as it was received: its step's slice put back from the transcript's
/// table of slices (21.2). `Err` names a reference to no slice.
pub fn restored_opening(
    open: &v1::RecordedOpen,
    recorded: &v1::RecordedOpening,
) -> Result<Option<v1::recorded_opening::Received>, String> {
    let mut received = recorded.received.clone();
    if recorded.slice_ref == 0 {
        return Ok(received);
    }
    let slice = open.slices.get(recorded.slice_ref as usize - 1).ok_or_else(|| {
        format!(
            "a step opening refers to slice {} of {} recorded",
            recorded.slice_ref,
            open.slices.len()
        )
    })?;
    match &mut received {
        Some(v1::recorded_opening::Received::Opening(v1::ChainOpening { step: Some(step), .. }))
            if step.slice.is_empty() =>
        {
            step.slice = slice.clone();
            Ok(received)
        }
        _ => Err("a slice reference on a recording that is no step opening with its slice moved".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> v1::Transcript {
        v1::Transcript {
            format: FORMAT,
            verdict_json: "{}".into(),
            miner_url: "https://miner:7000".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_sealed_transcript_opens_with_a_valid_signature_and_any_changed_byte_breaks_it() {
        let key = KeyPair::from_seed([7; 32]);
        let file = seal(&sample(), &key);
        let opened = open(&file).unwrap();
        assert!(opened.signature_valid);
        assert_eq!(opened.signer, Some(key.public_key()));
        assert_eq!(opened.transcript, sample());
        let mut changed = 0;
        for at in 0..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 0x01;
            // A changed byte either stops the file decoding or fails its signature.
            assert!(
                !open(&bad).is_ok_and(|o| o.signature_valid),
                "byte {at} changed and the transcript still verifies"
            );
            changed += 1;
        }
        assert_eq!(changed, file.len());
    }

    /// PROTOCOL.md 21.1's vector: a transcript's bytes, what is signed and the signature, which
    /// this test computes and checks that the document quotes.
    #[test]
    fn the_signature_vector_is_protocol_md_s() {
        let key = KeyPair::from_seed([0x11; 32]);
        let transcript = v1::Transcript {
            format: 1,
            verdict_json: "{}".into(),
            plan_json: "{}".into(),
            miner_url: "https://miner.example:7070".into(),
            ..Default::default()
        };
        let bytes = transcript.encode_to_vec();
        let file = seal(&transcript, &key);
        let signed = v1::SignedTranscript::decode(file.as_slice()).unwrap();
        let doc = include_str!("../PROTOCOL.md");
        let values = [
            hex::encode(key.public_key().0),
            hex::encode(DOMAIN),
            hex::encode(&bytes),
            hex::encode(Sha256::digest(&bytes)),
            hex::encode(signed.signature),
        ];
        let missing: Vec<&String> = values.iter().filter(|v| !doc.contains(v.as_str())).collect();
        assert!(missing.is_empty(), "PROTOCOL.md 21.1 does not quote {missing:?}");
    }

    /// Short entries deep inside one entry (a step opening's proof of empty hashes, 2 bytes
    /// each encoded and some 24 decoded), and lists of empty messages spread over many copies
    /// of one field, are costed too, and refused before decoding.
    #[test]
    fn a_transcript_too_costly_to_decode_at_any_depth_is_refused_before_it_is_decoded() {
        let key = KeyPair::from_seed([7; 32]);
        let opening = |proof: usize| v1::RecordedOpening {
            received: Some(v1::recorded_opening::Received::Opening(v1::ChainOpening {
                step: Some(v1::StepOpening {
                    walker_proof: vec![Vec::new(); proof],
                    ..Default::default()
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let with = |proof| v1::Transcript {
            open: Some(v1::RecordedOpen {
                openings: vec![opening(proof)],
                ..Default::default()
            }),
            ..sample()
        };
        // The limit is the floor and the transcript's own size: entries of 2 bytes costing 32
        // each pass it by a third at this count.
        let too_many = (MAX_DECODING_COST / 24) as usize;
        assert_eq!(
            open(&seal(&with(too_many), &key)).unwrap_err(),
            TranscriptError::TooCostly
        );
        // A packed list counts a field a byte.
        let packed = v1::Transcript {
            challenge: Some(v1::Challenge {
                chain_pool: Some(v1::ChainPoolParams {
                    pool_chains: vec![1; (MAX_DECODING_COST / 6) as usize],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..sample()
        };
        assert_eq!(open(&seal(&packed, &key)).unwrap_err(), TranscriptError::TooCostly);
        // So a version 3 walk opening's rows.
        let rows = v1::Transcript {
            open: Some(v1::RecordedOpen {
                openings: vec![v1::RecordedOpening {
                    walk_rows: vec![1; (MAX_DECODING_COST / 6) as usize],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..sample()
        };
        assert_eq!(open(&seal(&rows, &key)).unwrap_err(), TranscriptError::TooCostly);
        // The open field written again and again, each time with fewer openings than a list may
        // hold: prost would join them into one list; the cost is over them all.
        let one = v1::Transcript {
            open: Some(v1::RecordedOpen {
                openings: vec![v1::RecordedOpening::default(); 60_000],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        let mut repeated = sample().encode_to_vec();
        let copies = 2 * (MAX_DECODING_COST / (60_000 * MESSAGE_COST)) as usize + 1;
        for _ in 0..copies {
            repeated.extend_from_slice(&one);
        }
        let signed = v1::SignedTranscript {
            validator_key: key.public_key().0.to_vec(),
            signature: vec![0; 64],
            transcript: repeated,
        }
        .encode_to_vec();
        assert_eq!(open(&signed).unwrap_err(), TranscriptError::TooCostly);
        assert!(open(&seal(&with(1000), &key)).is_ok());
        // So inside a locality opening's lines: short proofs in one line of one opening.
        let locality = |proof: usize| v1::Transcript {
            locality: Some(v1::RecordedLocality {
                openings: vec![v1::RecordedLocalityOpening {
                    received: Some(v1::recorded_locality_opening::Received::Opening(v1::LocalityOpening {
                        lines: vec![v1::LineProof {
                            chain_proof: vec![Vec::new(); proof],
                            ..Default::default()
                        }],
                        ..Default::default()
                    })),
                }],
                ..Default::default()
            }),
            ..sample()
        };
        assert_eq!(
            open(&seal(&locality(too_many), &key)).unwrap_err(),
            TranscriptError::TooCostly
        );
        assert!(open(&seal(&locality(1000), &key)).is_ok());
    }

    /// The decoding cost's limit grows with the transcript: entries that take about what they cost
    /// (a proof's hash, 34 bytes costed at 32) pass a floor they would not pass alone, where
    /// empty ones of the same count (2 bytes costed at 32) are refused. At a floor of 1 MiB, so
    /// that the test need not build a transcript of the real floor's 256 MiB.
    #[test]
    fn the_decoding_cost_limit_is_the_floor_and_the_transcripts_own_size() {
        let with = |hash: Vec<u8>| {
            v1::Transcript {
                open: Some(v1::RecordedOpen {
                    openings: vec![v1::RecordedOpening {
                        received: Some(v1::recorded_opening::Received::Opening(v1::ChainOpening {
                            step: Some(v1::StepOpening {
                                walker_proof: vec![hash; 100_000],
                                ..Default::default()
                            }),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..sample()
            }
            .encode_to_vec()
        };
        let floor = 1 << 20;
        let hashes = with(vec![0xab; 32]);
        let mut cost = 0;
        decoding_cost(&hashes, TRANSCRIPT, &mut cost, u64::MAX).unwrap();
        assert!(cost > floor, "the test's transcript costs {cost}, under the floor");
        assert_eq!(within_limits_at(&hashes, floor), Ok(()));
        assert_eq!(
            within_limits_at(&with(Vec::new()), floor),
            Err(TranscriptError::TooCostly)
        );
    }

    /// A file of many short entries (two bytes each, a few hundred once decoded) is refused on
    /// its count, before it is decoded; and `seal_readable`, which a validator keeps transcripts
    /// with, refuses to seal what `open` would refuse.
    #[test]
    fn a_transcript_of_too_many_entries_is_refused_before_it_is_decoded() {
        let key = KeyPair::from_seed([7; 32]);
        let many = v1::Transcript {
            open: Some(v1::RecordedOpen {
                openings: vec![v1::RecordedOpening::default(); MAX_ELEMENTS],
                ..Default::default()
            }),
            ..sample()
        };
        assert_eq!(
            open(&seal(&many, &key)).unwrap_err(),
            TranscriptError::TooMany { what: "openings" }
        );
        assert_eq!(
            seal_readable(&many, &key).unwrap_err(),
            TranscriptError::TooMany { what: "openings" }
        );
        assert!(open(&seal_readable(&sample(), &key).unwrap()).unwrap().signature_valid);
        let fewer = v1::Transcript {
            open: Some(v1::RecordedOpen {
                openings: vec![v1::RecordedOpening::default(); 1000],
                ..Default::default()
            }),
            ..sample()
        };
        assert!(open(&seal(&fewer, &key)).unwrap().signature_valid);
        // Version 3's walk statement's roots, one level further in.
        let roots = v1::Transcript {
            walk: Some(v1::RecordedWalk {
                statement: Some(v1::WalkStatement {
                    roots: vec![v1::WalkRoot::default(); MAX_ELEMENTS],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..sample()
        };
        assert_eq!(
            open(&seal(&roots, &key)).unwrap_err(),
            TranscriptError::TooMany { what: "walk roots" }
        );
    }

    #[test]
    fn what_is_not_a_transcript_is_an_error_never_a_panic() {
        assert!(matches!(open(b""), Err(TranscriptError::NotATranscript(_))));
        assert!(matches!(open(b"\xff\xff\xff"), Err(TranscriptError::NotATranscript(_))));
        let key = KeyPair::from_seed([7; 32]);
        let file = seal(&sample(), &key);
        for cut in 0..file.len() {
            // Truncated anywhere: an error or (where the cut falls between fields) a bad
            // signature, never a panic and never a valid transcript.
            if let Ok(opened) = open(&file[..cut]) {
                assert!(!opened.signature_valid, "cut at {cut}");
            }
        }
        let newer = v1::Transcript {
            format: FORMAT + 1,
            ..sample()
        };
        assert_eq!(
            open(&seal(&newer, &key)).unwrap_err(),
            TranscriptError::Format { found: FORMAT + 1 }
        );
    }
}
