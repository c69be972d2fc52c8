//! Every way a miner refuses or fails a request, and the one place each becomes a gRPC status.

use gpu_attest_proto::WireError;
use gpu_attest_shared::engine::EngineError;
use gpu_attest_shared::keys::PublicKey;
use gpu_attest_shared::memory::MemoryError;
use gpu_attest_shared::memory::chain_pool::ChainPoolParamsError;
use gpu_attest_shared::opening::OpenError;
use gpu_attest_shared::params::ParamsError;
use gpu_attest_shared::statement::memory_v3::WalkSample;
use gpu_attest_shared::statement::memory_v4::StepSample;
use gpu_attest_shared::{BackendError, Digest};
use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum MinerError {
    #[error("malformed request: {0}")]
    Wire(#[from] WireError),
    #[error("validator {0} is not on this miner's allow-list; add its key to allowed_validators")]
    ValidatorNotAllowed(PublicKey),
    #[error("challenge signature does not verify for validator {0}")]
    BadSignature(PublicKey),
    #[error("challenge is bound to miner key {bound}, but this miner's key is {ours}")]
    WrongMiner { bound: PublicKey, ours: PublicKey },
    #[error("nonce {0} was already used; every challenge needs a fresh nonce")]
    NonceReused(String),
    #[error(
        "challenge was sized for hardware with inventory digest {planned}, but this miner's is {ours}; its devices, backend or kernel changed since GetInventory: fetch the inventory again"
    )]
    InventoryChanged { planned: Digest, ours: Digest },
    #[error("challenge deadline passed {late_ms} ms ago by this miner's clock")]
    DeadlinePassed { late_ms: u64 },
    #[error("the challenge's {0} arrived before the work finished; the work was stopped and the devices freed")]
    DeadlineReached(&'static str),
    #[error(
        "the challenge's finish-by time ({finish_by_ms}) is not after its deadline ({deadline_ms}); a validator sets it later, or not at all"
    )]
    FinishByBeforeDeadline { deadline_ms: u64, finish_by_ms: u64 },
    #[error("invalid challenge parameters: {0}")]
    Params(#[from] ParamsError),
    #[error("challenge exceeds this miner's limit: {0}")]
    OverLimit(String),
    #[error("this miner's devices cannot hold the challenge: {0}")]
    NoRoom(BackendError),
    #[error(
        "this miner takes no work: {}; its operator must check the GPU (nvidia-smi) and restart the miner",
        .0.iter().map(|(d, why)| format!("device {d} is out of service ({why})")).collect::<Vec<_>>().join("; ")
    )]
    OutOfService(Vec<(u32, String)>),
    #[error("miner is busy with another challenge; one runs at a time, retry when it has finished")]
    Busy,
    #[error("miner is stopping (finishing the challenge in flight first); retry once it is back")]
    Stopping,
    #[error(
        "miner holds its devices for validator {0}, which has not yet opened its fresh commitment; retry in a few seconds"
    )]
    AwaitingOpenings(PublicKey),
    #[error("work stopped: {0}")]
    Engine(#[from] EngineError),
    #[error("no recent commitment for nonce {0}; commitments stay openable for a limited time")]
    UnknownCommitment(String),
    #[error("only the validator that issued the challenge, while still allowed, may open its chains")]
    OpenNotAllowed,
    #[error("open request signature does not verify")]
    BadOpenSignature,
    #[error("open request lists no samples; ask for at least one")]
    NoSamples,
    #[error("the chains of commitment {0} were already opened; an open request is single-use")]
    AlreadyOpened(String),
    #[error("{requested} openings asked for, this miner answers at most {max} per request")]
    TooManySamples { requested: usize, max: u32 },
    #[error("cannot open: {0}")]
    Open(#[from] OpenError),
    #[error("cannot record the nonce, so the challenge is refused: {0}")]
    NonceLog(#[from] crate::nonces::NonceLogError),
    #[error(
        "this miner's {0} backend cannot hold memory pools here (on GPUs: compute capability 6.1 or later is needed), so it speaks protocol version 2 (see its inventory): send a challenge without the memory phase"
    )]
    MemoryPhaseUnsupported(String),
    #[error(
        "this miner speaks protocol version {spoken}, and a version {asked} challenge needs a miner that speaks it \
         (version 4: `[limits] protocol_4 = true`, the default, on a backend that keeps its chain states): \
         have the validator send what the miner's inventory says it speaks"
    )]
    VersionNotSpoken { asked: u32, spoken: u32 },
    #[error("invalid memory phase: {0}")]
    Memory(MemoryError),
    #[error("the memory phase failed: {0}")]
    Fill(BackendError),
    #[error("commitment {0} answers a version 2 challenge: it has no pools to walk or open")]
    NoMemoryPhase(String),
    #[error("commitment {0} answers no version 4 challenge: it has no kept states to walk, and no walk steps to open")]
    NotVersion4(String),
    #[error("the pools of commitment {0} were already walked; a walk request is single-use")]
    AlreadyWalked(String),
    #[error("walk request signature does not verify")]
    BadWalkSignature,
    #[error(
        "walk samples asked for before the walk: send the walk request first (WalkPool in version 3, WalkStates in version 4)"
    )]
    NotWalked,
    #[error("invalid version 4 memory phase: {0}")]
    ChainPool(#[from] ChainPoolParamsError),
    #[error(
        "device {device}'s pool would hold {bytes} bytes, more than the {claimed} bytes the device claims; the validator sized it past the inventory"
    )]
    PoolOverClaim { device: u32, bytes: u64, claimed: u64 },
    #[error("commitment {nonce} answers a version {version} challenge: {what}")]
    OtherVersion {
        nonce: String,
        version: u32,
        what: &'static str,
    },
    #[error("step sample {0:?} names no device, walker or step of this walk")]
    StepSampleOutOfRange(StepSample),
    #[error("the pools of this commitment were released for a later challenge; they can no longer be walked or opened")]
    PoolsReleased,
    #[error("walk sample {0:?} names no device, walker or segment of this walk")]
    WalkSampleOutOfRange(WalkSample),
    #[error("{requested} walk openings asked for, this miner answers at most {max} per request")]
    TooManyWalkSamples { requested: usize, max: usize },
    #[error("the walk failed: {0}")]
    Walk(BackendError),
    #[error("locality walk refused: {0}")]
    LocalityShape(#[from] gpu_attest_shared::memory::locality::ShapeError),
    #[error(
        "the locality walk of commitment {0} was asked for before its version 4 walk: send WalkStates first, then WalkLines"
    )]
    LocalityBeforeWalk(String),
    #[error("the lines of commitment {0} were already walked; a locality request is single-use")]
    LinesAlreadyWalked(String),
    #[error("locality segments asked for before the locality walk: send WalkLines first")]
    LinesNotWalked,
    #[error("the locality segments of commitment {0} were already opened; a locality open request is single-use")]
    LinesAlreadyOpened(String),
    #[error("locality sample {0:?} names no device, generation or walker of this locality walk")]
    LocalitySampleOutOfRange(gpu_attest_shared::statement::locality::SegmentSample),
    #[error("locality request signature does not verify")]
    BadLocalitySignature,
}

impl MinerError {
    /// The gRPC status code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            MinerError::Wire(_)
            | MinerError::Params(_)
            | MinerError::FinishByBeforeDeadline { .. }
            | MinerError::NoSamples
            | MinerError::ChainPool(_)
            | MinerError::Memory(_) => Code::InvalidArgument,
            MinerError::PoolOverClaim { .. } => Code::ResourceExhausted,
            MinerError::OtherVersion { .. } => Code::FailedPrecondition,
            MinerError::StepSampleOutOfRange(_) | MinerError::LocalitySampleOutOfRange(_) => Code::OutOfRange,
            MinerError::LocalityShape(_) => Code::InvalidArgument,
            MinerError::LocalityBeforeWalk(_) | MinerError::LinesNotWalked => Code::FailedPrecondition,
            MinerError::LinesAlreadyWalked(_) | MinerError::LinesAlreadyOpened(_) => Code::AlreadyExists,
            MinerError::BadLocalitySignature => Code::Unauthenticated,
            MinerError::BadWalkSignature => Code::Unauthenticated,
            MinerError::AlreadyWalked(_) => Code::AlreadyExists,
            MinerError::NoMemoryPhase(_)
            | MinerError::NotVersion4(_)
            | MinerError::NotWalked
            | MinerError::PoolsReleased
            | MinerError::MemoryPhaseUnsupported(_)
            | MinerError::VersionNotSpoken { .. } => Code::FailedPrecondition,
            MinerError::WalkSampleOutOfRange(_) => Code::OutOfRange,
            MinerError::TooManyWalkSamples { .. } => Code::ResourceExhausted,
            MinerError::Fill(b) | MinerError::Walk(b) => backend_code(b),
            MinerError::ValidatorNotAllowed(_) | MinerError::OpenNotAllowed => Code::PermissionDenied,
            MinerError::BadSignature(_) | MinerError::BadOpenSignature => Code::Unauthenticated,
            MinerError::WrongMiner { .. } | MinerError::InventoryChanged { .. } => Code::FailedPrecondition,
            MinerError::NonceReused(_) | MinerError::AlreadyOpened(_) => Code::AlreadyExists,
            MinerError::DeadlinePassed { .. } | MinerError::DeadlineReached(_) => Code::DeadlineExceeded,
            MinerError::OverLimit(_)
            | MinerError::Busy
            | MinerError::AwaitingOpenings(_)
            | MinerError::TooManySamples { .. } => Code::ResourceExhausted,
            MinerError::UnknownCommitment(_) => Code::NotFound,
            MinerError::NonceLog(_) | MinerError::OutOfService(_) | MinerError::Stopping => Code::Unavailable,
            MinerError::NoRoom(b) => backend_code(b),
            MinerError::Engine(e) => engine_code(e),
            MinerError::Open(OpenError::Backend(b)) => backend_code(b),
            MinerError::Open(OpenError::NotComputed(_)) => Code::Internal,
            MinerError::Open(_) => Code::OutOfRange,
        }
    }
}

impl From<MinerError> for Status {
    fn from(e: MinerError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

fn engine_code(e: &EngineError) -> Code {
    match e {
        EngineError::Backend(b) => backend_code(b),
        _ => Code::Internal,
    }
}

fn backend_code(e: &BackendError) -> Code {
    match e {
        BackendError::Cancelled => Code::Cancelled,
        BackendError::OutOfMemory { .. } => Code::ResourceExhausted,
        BackendError::Device { .. } | BackendError::NoSuchDevice { .. } | BackendError::OutOfService { .. } => {
            Code::Unavailable
        }
        BackendError::WrongMatrixSize { .. }
        | BackendError::StepsOutOfRange { .. }
        | BackendError::PoolOutsideChains { .. } => Code::Internal,
        BackendError::Unsupported { .. } => Code::Unimplemented,
    }
}
