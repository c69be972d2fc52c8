//! What a version 4 walk catches, computed against the best cheater known
//! (docs/design/protocol-v4.md sections 4 and 6), so that a planner sizes its openings from the
//! arithmetic instead of a constant, and so that every figure the design and SECURITY.md give can
//! be reproduced (`cargo run -p gpu-attest-shared --example memory_bounds`).
//!
//! The clock: a device short of a share `x` of its pool makes the missing bytes up from other
//! sources at once, while it reads the rest. Sources delivering `sum r_i` bytes a second hide, in
//! a deadline of `S` times the expected walk at rate `b`, a shortfall of up to
//! `x* = S * sum r_i / b`. What lies beyond `x*` the cheater must fake, and the openings catch a
//! faked step; but a cheater grinds (after a faked step it chooses the next state, and tries
//! candidates until the steps that follow hit slices it holds), so it fakes only `phi_min` of its
//! steps, below `x - x*`.

/// Published figures of one GPU model: the sources a cheater on it can draw from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceModel {
    pub name: &'static str,
    /// Device memory bandwidth, bytes a second (datasheet).
    pub bandwidth: f64,
    /// Dense int8 tensor peak, operations a second (datasheet; half the sparse figure).
    pub int8_peak: f64,
    /// Payload ceiling of the host link, one direction, bytes a second.
    pub host_link: f64,
    /// NVLink to peer GPUs, one direction, bytes a second; `None` without NVLink.
    pub peer_link: Option<f64>,
    /// NVLink-C2C to a Grace CPU's memory, one direction, bytes a second.
    pub c2c: Option<f64>,
    /// Streaming multiprocessors (datasheet): the locality walk's walkers on this model, one an
    /// SM. 0 for the stand-ins ([`UNKNOWN_GPU`], [`CPU`]), which no walk is sized by.
    pub sms: u32,
}

const GB: f64 = 1e9;
const TB: f64 = 1e12;
/// PCIe payload ceilings, x16, one direction: `GT/s * 16 lanes * 128/130 / 8`.
pub const PCIE_GEN4_X16: f64 = 16.0 * 16.0 * 128.0 / 130.0 / 8.0 * GB;
pub const PCIE_GEN5_X16: f64 = 32.0 * 16.0 * 128.0 / 130.0 / 8.0 * GB;

/// The models the design's tables cover (NVIDIA datasheets; the Ada whitepaper for the RTX 4090).
pub const MODELS: &[DeviceModel] = &[
    DeviceModel {
        name: "H100 SXM",
        bandwidth: 3.35 * TB,
        int8_peak: 1979.0 * TB,
        host_link: PCIE_GEN5_X16,
        peer_link: Some(450.0 * GB),
        c2c: None,
        sms: 132,
    },
    DeviceModel {
        name: "H200",
        bandwidth: 4.8 * TB,
        int8_peak: 1979.0 * TB,
        host_link: PCIE_GEN5_X16,
        peer_link: Some(450.0 * GB),
        c2c: None,
        sms: 132,
    },
    DeviceModel {
        name: "A100 80GB SXM",
        bandwidth: 2.039 * TB,
        int8_peak: 624.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 108,
    },
    DeviceModel {
        name: "RTX 4090",
        bandwidth: 1.008 * TB,
        int8_peak: 660.6 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 128,
    },
    DeviceModel {
        name: "GH200 96 GB",
        bandwidth: 4.0 * TB,
        int8_peak: 1979.0 * TB,
        host_link: 0.0,
        peer_link: Some(450.0 * GB),
        c2c: Some(450.0 * GB),
        sms: 132,
    },
    DeviceModel {
        name: "GH200 144 GB",
        bandwidth: 4.9 * TB,
        int8_peak: 1979.0 * TB,
        host_link: 0.0,
        peer_link: Some(450.0 * GB),
        c2c: Some(450.0 * GB),
        sms: 132,
    },
];

/// Datasheet figures of parts the design's tables do not size openings for: a device of one of
/// these is opened as the table's worst row, and its verdict states the bound its own figures
/// give (NVIDIA datasheets; dense int8, half the sparse figure; one direction of each link).
pub const OTHER_MODELS: &[DeviceModel] = &[
    DeviceModel {
        name: "H100 PCIe",
        bandwidth: 2.0 * TB,
        int8_peak: 1513.0 * TB,
        host_link: PCIE_GEN5_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 114,
    },
    DeviceModel {
        name: "H100 NVL",
        bandwidth: 3.9 * TB,
        int8_peak: 1670.5 * TB,
        host_link: PCIE_GEN5_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 132,
    },
    DeviceModel {
        name: "A100 40GB SXM",
        bandwidth: 1.555 * TB,
        int8_peak: 624.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 108,
    },
    DeviceModel {
        name: "A100 80GB PCIe",
        bandwidth: 1.935 * TB,
        int8_peak: 624.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 108,
    },
    DeviceModel {
        name: "A100 40GB PCIe",
        bandwidth: 1.555 * TB,
        int8_peak: 624.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: Some(300.0 * GB),
        c2c: None,
        sms: 108,
    },
    DeviceModel {
        name: "L40S",
        bandwidth: 0.864 * TB,
        int8_peak: 733.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 142,
    },
    DeviceModel {
        name: "L40",
        bandwidth: 0.864 * TB,
        int8_peak: 362.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 142,
    },
    DeviceModel {
        name: "L4",
        bandwidth: 0.3 * TB,
        int8_peak: 242.5 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 58,
    },
    DeviceModel {
        name: "A10",
        bandwidth: 0.6 * TB,
        int8_peak: 250.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 72,
    },
    DeviceModel {
        name: "RTX 3090",
        bandwidth: 0.936 * TB,
        int8_peak: 284.0 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: Some(56.25 * GB),
        c2c: None,
        sms: 82,
    },
    DeviceModel {
        name: "RTX 6000 Ada",
        bandwidth: 0.96 * TB,
        int8_peak: 728.5 * TB,
        host_link: PCIE_GEN4_X16,
        peer_link: None,
        c2c: None,
        sms: 142,
    },
];

/// What a GPU outside both tables is taken to be: the most of every source any GPU this release
/// knows of has (a B200's 8 TB/s and 4.5 dense int8 Pops/s, a Grace's 450 GB/s C2C link), so
/// that its bound holds whatever it is. It is weak by design: name the part in the table.
pub const UNKNOWN_GPU: DeviceModel = DeviceModel {
    name: "an unlisted GPU",
    bandwidth: 8.0 * TB,
    int8_peak: 4500.0 * TB,
    host_link: 450.0 * GB,
    peer_link: None,
    c2c: None,
    sms: 0,
};

/// What a CPU device is taken to be: its pool sits in host memory, and a cheater serves what it
/// lacks from anything else the host reaches (drives, or another host over a 400 Gb/s network:
/// 50 GB/s), at a memory bandwidth as high as a twelve-channel DDR5 server's. A CPU's walk is
/// paced by hashing, not by memory, so its bound is usually nothing: the verdict says so.
pub const CPU: DeviceModel = DeviceModel {
    name: "a CPU",
    bandwidth: 0.5 * TB,
    int8_peak: 0.0,
    host_link: 50.0 * GB,
    peer_link: None,
    c2c: None,
    sms: 0,
};

/// Every model of [`MODELS`] and [`OTHER_MODELS`]: the shipped table.
pub fn models() -> impl Iterator<Item = &'static DeviceModel> {
    MODELS.iter().chain(OTHER_MODELS)
}

/// The model named `name` in [`MODELS`] or [`OTHER_MODELS`].
pub fn model(name: &str) -> Option<&'static DeviceModel> {
    models().find(|m| m.name == name)
}

/// Whether `model` is one of the design's table ([`MODELS`]), whose counts size openings; the
/// others are opened as its worst row.
pub fn sizes_openings(model: &DeviceModel) -> bool {
    MODELS.iter().any(|m| m.name == model.name)
}

/// The model of [`MODELS`] or [`OTHER_MODELS`] a device reporting `name` with `memory_bytes`
/// is, if any. Any other GPU, and a CPU, is `None`: [`bound_model`] says what it is taken to be.
pub fn model_for_device(name: &str, memory_bytes: u64) -> Option<&'static DeviceModel> {
    let name = name.to_ascii_lowercase();
    let has = |part: &str| name.contains(part);
    // Whole words, so that "l4" is not "l40s" and "a10" is not "a100".
    let words: Vec<&str> = name.split(|c: char| !c.is_ascii_alphanumeric()).collect();
    let word = |w: &str| words.contains(&w);
    let pcie = has("pcie");
    let nvl = has("nvl");
    let found = if has("gh200") {
        // The 96 GB part reports about 102e9 bytes (97871 MiB), the 144 GB part about 151e9.
        if memory_bytes <= 120 * 1_000_000_000 {
            "GH200 96 GB"
        } else {
            "GH200 144 GB"
        }
    } else if has("h200") && !pcie && !nvl {
        "H200"
    } else if has("h100") && nvl {
        "H100 NVL"
    } else if has("h100") && pcie {
        "H100 PCIe"
    } else if has("h100") {
        "H100 SXM"
    } else if has("a100") {
        // NVML names the memory ("A100-SXM4-40GB", "A100 80GB PCIe"); the size decides where
        // it does not.
        let eighty = has("80gb") || (!has("40gb") && memory_bytes > 60 * 1_000_000_000);
        match (eighty, pcie) {
            (true, false) => "A100 80GB SXM",
            (true, true) => "A100 80GB PCIe",
            (false, false) => "A100 40GB SXM",
            (false, true) => "A100 40GB PCIe",
        }
    } else if has("rtx 4090") {
        "RTX 4090"
    } else if has("rtx 3090") {
        "RTX 3090"
    } else if has("rtx 6000 ada") {
        "RTX 6000 Ada"
    } else if word("l40s") {
        "L40S"
    } else if word("l40") {
        "L40"
    } else if word("l4") {
        "L4"
    } else if word("a10") {
        "A10"
    } else {
        return None;
    };
    model(found)
}

/// What a device's bound is computed with: its model where the tables name it, else [`CPU`] on
/// the CPU backend and [`UNKNOWN_GPU`] on any other. Every device gets a bound.
pub fn bound_model(backend: &str, name: &str, memory_bytes: u64) -> &'static DeviceModel {
    match model_for_device(name, memory_bytes) {
        Some(model) => model,
        None if backend == "cpu" => &CPU,
        None => &UNKNOWN_GPU,
    }
}

/// The sources a model's bound is computed against: its own regeneration with everything
/// behind its host link (row C), or on a GH200 its regeneration with Grace's memory over C2C
/// (its row D): what the clock leaves hidden is the more for it, and a GH200 pass states it.
pub fn sized_sources(model: &DeviceModel) -> Sources {
    match model.c2c {
        Some(_) => Sources::RegenerateAndGrace,
        None => Sources::RegenerateAndHost,
    }
}

/// Which sources a cheater uses together (the design's rows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sources {
    /// A: the device's own idle tensor cores make missing slices again.
    Regenerate,
    /// B: anything behind the host link (host memory, drives, the host's CPUs).
    HostLink,
    /// C: A and B at once.
    RegenerateAndHost,
    /// E: C plus NVLink peers (their spare memory, compute and host links), capped by this
    /// device's own NVLink; on a GH200, A plus Grace over C2C plus peers.
    WithPeers,
    /// A GH200's row: A plus Grace's memory and CPUs over C2C.
    RegenerateAndGrace,
}

impl DeviceModel {
    /// Bytes a second of missing pool that regeneration delivers: `P / kappa`.
    pub fn regeneration_rate(&self, kappa: f64) -> f64 {
        self.int8_peak / kappa
    }

    /// `sum r_i` for `sources`, or `None` where the model lacks them (peers without NVLink, Grace
    /// without C2C).
    pub fn source_rate(&self, sources: Sources, kappa: f64) -> Option<f64> {
        let regenerate = self.regeneration_rate(kappa);
        let outside = match self.c2c {
            Some(c2c) => c2c,
            None => self.host_link,
        };
        Some(match sources {
            Sources::Regenerate => regenerate,
            Sources::HostLink if self.c2c.is_none() => self.host_link,
            Sources::RegenerateAndHost if self.c2c.is_none() => regenerate + self.host_link,
            Sources::RegenerateAndGrace => regenerate + self.c2c?,
            Sources::WithPeers => regenerate + outside + self.peer_link?,
            Sources::HostLink | Sources::RegenerateAndHost => return None,
        })
    }
}

/// How the deadline of a walk is set: `S` times the time at `rate` bytes a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WalkClock {
    pub slack: f64,
    /// The rate the expected time is computed from: a class's learned rate, or the shipped
    /// first-contact share of the datasheet bandwidth.
    pub rate: f64,
}

impl WalkClock {
    /// `x* = S * sum r_i / b`: the largest share of the pool the clock cannot see missing.
    pub fn undetected_shortfall(&self, source_rate: f64) -> f64 {
        self.slack * source_rate / self.rate
    }
}

/// The pool shortfall of a device that holds `held` of its claim, with a pool of `pool_share` of
/// the claim: `1 - held / p` (0 when it holds the pool).
pub fn shortfall_holding(held: f64, pool_share: f64) -> f64 {
    (1.0 - held / pool_share).max(0.0)
}

/// The fewest faked steps, as a share of the walk, of a cheater short by `x` whose clock hides
/// `x_star`, with `reads` walk-lengths of reads in the deadline at its full bandwidth (`S / eta`,
/// `eta` the honest walk's share of that bandwidth): the root of
/// `phi (1 + 2x + x r) = x - x*` with `(1 - x)^(-r) = 1 + x (gamma / phi + r)` and
/// `gamma = reads - 1 + x* + phi` (design 6.2). `None` when `x <= x*`: the clock leaves nothing to
/// fake.
pub fn least_faked_share(x: f64, x_star: f64, reads: f64) -> Option<f64> {
    let faked = x - x_star;
    if !(faked > 0.0 && x < 1.0 && reads >= 1.0) {
        return None;
    }
    let excess = |phi: f64| {
        let gamma = reads - 1.0 + x_star + phi;
        let run = held_run(x, gamma / phi);
        phi * (1.0 + 2.0 * x + x * run) - faked
    };
    // `excess` rises with phi, is negative near 0 and positive at `faked`.
    Some(bisect(1e-12, faked, excess))
}

/// The run of held steps the cheater of [`least_faked_share`] grinds for after each fake when it
/// fakes a share `faked` of the walk: its spare reads, `gamma = reads - 1 + x* + phi` walk-lengths,
/// spread evenly over its fakes (design 6.2). The placed-fakes benchmark plays that cheater.
pub fn ground_run(x: f64, x_star: f64, reads: f64, faked: f64) -> f64 {
    held_run(x, (reads - 1.0 + x_star + faked) / faked)
}

/// The run `r` of held indices that a waste of `waste` reads per fake buys:
/// `(1 - x)^(-r) = 1 + x (waste + r)`.
fn held_run(x: f64, waste: f64) -> f64 {
    let gap = |r: f64| (-r * (1.0 - x).ln()).exp() - 1.0 - x * (waste + r);
    // gap(0) < 0; grow the bracket until it turns.
    let mut high = 1.0;
    while gap(high) < 0.0 && high < 1e9 {
        high *= 2.0;
    }
    bisect(0.0, high, gap)
}

/// The root of an increasing `f` in `[low, high]`.
fn bisect(mut low: f64, mut high: f64, f: impl Fn(f64) -> f64) -> f64 {
    // 52 halvings: the root to the bracket's last bit of precision.
    for _ in 0..52 {
        let mid = 0.5 * (low + high);
        if f(mid) > 0.0 {
            high = mid;
        } else {
            low = mid;
        }
    }
    low
}

/// Openings that catch a share `faked` of bad steps with probability at least `1 - pass`:
/// `ceil(ln(1 / pass) / -ln(1 - faked))`.
pub fn openings_for(faked: f64, pass: f64) -> u32 {
    ((1.0 / pass).ln() / -(1.0 - faked).ln()).ceil() as u32
}

/// The design's parameters: pool share, regeneration cost per byte, calibrated slack, the honest
/// walk's share of the datasheet bandwidth, and the pass probability openings are sized for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Design {
    pub pool_share: f64,
    pub kappa: f64,
    pub slack: f64,
    pub eta: f64,
    pub pass: f64,
}

pub const VERSION_4: Design = Design {
    pool_share: 0.96,
    kappa: 131_072.0,
    slack: 1.25,
    eta: 0.9,
    pass: 0.005,
};

/// One model's sizing at the design's parameters, for a device holding 90% of its claim.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sizing {
    /// Shortfall of a device holding 90% of its claim.
    pub shortfall: f64,
    /// `x*` for the sources (row C or the GH200's Grace-less row A).
    pub undetected: f64,
    /// `phi_min`; `None` when the clock alone does not catch the 90% holder.
    pub faked: Option<f64>,
    /// Walk steps to open, and rows to check, for `pass`.
    pub openings: Option<u32>,
    pub row_checks: Option<u32>,
}

impl Design {
    pub fn calibrated_clock(&self, model: &DeviceModel) -> WalkClock {
        WalkClock {
            slack: self.slack,
            rate: self.eta * model.bandwidth,
        }
    }

    /// Sizes the openings of `model` against `sources` for a device holding 90% of its claim.
    pub fn size(&self, model: &DeviceModel, sources: Sources) -> Option<Sizing> {
        let rate = model.source_rate(sources, self.kappa)?;
        let undetected = self.calibrated_clock(model).undetected_shortfall(rate);
        let shortfall = shortfall_holding(0.9, self.pool_share);
        let faked = least_faked_share(shortfall, undetected, self.slack / self.eta);
        Some(Sizing {
            shortfall,
            undetected,
            faked,
            openings: faked.map(|phi| openings_for(phi, self.pass)),
            row_checks: faked.map(|_| openings_for(shortfall - undetected, self.pass)),
        })
    }
}

/// Cheap-state shares tried per shortfall when searching the best mixed cheater (design 6.4),
/// before the best one is refined.
const MIX_GRID: usize = 32;

/// The best mixed cheater short by `x` (design 6.4), whose clock hides `x_star` with `reads`
/// walk-lengths of reads: it commits a share `g` of its pool as cheap states, walked honestly
/// (a row check catches one with probability `g`), and fakes `phi(x - g)` of its steps for the
/// rest (any opening catches one). Its pass probability against `steps` openings of which
/// `rows` have a row checked, `max over g in [0, x - x*] of (1 - g)^rows (1 - phi(x - g))^steps`,
/// and the `g` that gives it.
pub fn mixed_pass(x: f64, x_star: f64, reads: f64, steps: u32, rows: u32) -> (f64, f64) {
    let span = x - x_star;
    if span <= 0.0 {
        return (1.0, 0.0);
    }
    let faked_at = |g: f64| least_faked_share(x - g, x_star, reads).unwrap_or(0.0);
    let log_pass = |g: f64| {
        f64::from(rows) * (1.0 - g).max(f64::MIN_POSITIVE).ln()
            + f64::from(steps) * (1.0 - faked_at(g)).max(f64::MIN_POSITIVE).ln()
    };
    let grid = |i: usize| span * i as f64 / MIX_GRID as f64;
    let best = (0..=MIX_GRID)
        .max_by(|&a, &b| log_pass(grid(a)).total_cmp(&log_pass(grid(b))))
        .unwrap_or(0);
    // Refined between the best point's neighbours by a golden-section search, one new point
    // a round.
    let (mut low, mut high) = (grid(best.saturating_sub(1)), grid((best + 1).min(MIX_GRID)));
    let ratio = 0.5 * (5f64.sqrt() - 1.0);
    let (mut a, mut b) = (high - ratio * (high - low), low + ratio * (high - low));
    let (mut at_a, mut at_b) = (log_pass(a), log_pass(b));
    for _ in 0..30 {
        if at_a < at_b {
            low = a;
            (a, at_a) = (b, at_b);
            b = low + ratio * (high - low);
            at_b = log_pass(b);
        } else {
            high = b;
            (b, at_b) = (a, at_a);
            a = high - ratio * (high - low);
            at_a = log_pass(a);
        }
    }
    let refined = 0.5 * (low + high);
    let (g, log) = [(grid(best), log_pass(grid(best))), (refined, log_pass(refined))]
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("two candidates");
    (log.exp(), g)
}

/// What one device's walk proves at the clock it was timed by, with the openings it was opened
/// with: the weaker bound a first-contact verdict (or any verdict whose device is expected below
/// the design's `eta`) states instead of "holding 90% is caught".
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Proven {
    /// `x*` at this clock.
    pub undetected: f64,
    /// The smallest pool shortfall caught with probability at least `1 - pass` by the best
    /// mixed cheater (cheap states for some of it, faked and ground steps for the rest,
    /// [`mixed_pass`]). 1 when no shortfall is.
    pub shortfall_caught: f64,
    /// `pool_share * (1 - shortfall_caught)`: a device holding less of its claim than this is
    /// caught with probability at least `1 - pass`.
    pub held_at_least: f64,
}

/// One device's clock, as the bound needs it: `x*` and the reads its deadline allows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clocked {
    pub undetected: f64,
    pub reads: f64,
}

impl Design {
    /// The clock of a device of `model` timed at `slack` over `eta` of its datasheet bandwidth,
    /// against `sources`; `None` where the model lacks them.
    pub fn clocked(&self, model: &DeviceModel, sources: Sources, slack: f64, eta: f64) -> Option<Clocked> {
        let rate = model.source_rate(sources, self.kappa)?;
        Some(Clocked {
            undetected: WalkClock {
                slack,
                rate: eta * model.bandwidth,
            }
            .undetected_shortfall(rate),
            reads: (slack / eta).max(1.0),
        })
    }

    /// The clock of device `own` of a host whose devices are `host` (`own` among them), timed at
    /// `slack` over `eta` of its datasheet bandwidth, when any device of the host may serve its
    /// walk. A walker's state is 32 bytes, so a walker can move to whichever device holds the
    /// slice it needs next: a device's pool need not sit in that device's memory. What the
    /// clock then hides of that pool is what every device's sources together deliver (each its
    /// own [`sized_sources`]), and the cheater's spare reads are the whole host's bandwidth.
    /// Giving every pool all of it at once only weakens the bound, so a bound computed on this
    /// clock holds for each pool whatever the others do: the host holds less than the sum of
    /// the pools' bounds only if some pool is below its own. On a host of one device it is
    /// [`Design::clocked`] with that device's sources.
    pub fn pooled_clock(&self, own: &DeviceModel, host: &[&DeviceModel], slack: f64, eta: f64) -> Clocked {
        let sources: f64 = host
            .iter()
            .map(|m| m.source_rate(sized_sources(m), self.kappa).unwrap_or(0.0))
            .sum();
        let bandwidth: f64 = host.iter().map(|m| m.bandwidth).sum();
        let expected = eta * own.bandwidth;
        Clocked {
            undetected: WalkClock { slack, rate: expected }.undetected_shortfall(sources),
            // As `clocked`'s `S / eta`, times the host's bandwidth over the device's own.
            reads: (slack / eta * (bandwidth / own.bandwidth)).max(1.0),
        }
    }

    /// What `steps` openings and `rows` row checks prove of a device on `clock`: the least
    /// shortfall the best mixed cheater passes with at most `pass`. Its pass probability falls
    /// as the shortfall grows (a larger shortfall leaves more to fake, and the cheap share it
    /// adds passes no better than the largest it had), so it is found by bisection.
    pub fn proven(&self, clock: Clocked, steps: u32, rows: u32) -> Proven {
        let undetected = clock.undetected;
        let passes = |x: f64| mixed_pass(x, undetected, clock.reads, steps, rows).0 > self.pass;
        let top = 1.0 - 1e-9;
        let shortfall_caught = if undetected >= top || passes(top) {
            1.0
        } else {
            let (mut low, mut high) = (undetected, top);
            // 32 halvings: the shortfall to 1e-9, far below any figure a verdict states.
            for _ in 0..32 {
                let mid = 0.5 * (low + high);
                if passes(mid) {
                    low = mid;
                } else {
                    high = mid;
                }
            }
            high
        };
        Proven {
            undetected,
            shortfall_caught,
            held_at_least: self.pool_share * (1.0 - shortfall_caught),
        }
    }

    /// The openings and row checks a device on `clock` gets (PROTOCOL.md 20.9 step 6): `base`,
    /// its model's counts at the design's clock, raised towards [`Design::mixed_counts`] at its
    /// own clock but never past `cap`, and the cap itself where no count catches the 90%
    /// holder there.
    pub fn opened(&self, base: (u32, u32), clock: Clocked, cap: (u32, u32)) -> (u32, u32) {
        match self.mixed_counts(clock) {
            Some((s, r)) => (base.0.max(s.min(cap.0)), base.1.max(r.min(cap.1))),
            None => (base.0.max(cap.0), base.1.max(cap.1)),
        }
    }

    /// The fewest openings and row checks, in the ratio of the single-strategy counts of
    /// [`Design::size`] at this clock, that catch the best mixed cheater short by the 90%
    /// holder's shortfall with probability at least `1 - pass`; `None` where the clock alone
    /// hides that shortfall (nothing is left to open for).
    pub fn mixed_counts(&self, clock: Clocked) -> Option<(u32, u32)> {
        let x = shortfall_holding(0.9, self.pool_share);
        let faked = least_faked_share(x, clock.undetected, clock.reads)?;
        let (steps, rows) = (
            openings_for(faked, self.pass),
            openings_for(x - clock.undetected, self.pass),
        );
        let caught = |scale: f64| {
            let (s, q) = (
                (f64::from(steps) * scale).ceil() as u32,
                (f64::from(rows) * scale).ceil() as u32,
            );
            (mixed_pass(x, clock.undetected, clock.reads, s, q).0 <= self.pass).then_some((s, q))
        };
        // Each single strategy is caught at scale 1; the mix needs a little more (design 6.4:
        // it passed 0.53-0.74% there). The least scale in whole percent, at most fourfold: more
        // openings never pass the cheater more often, so it is found by bisection.
        let (mut low, mut high) = (99u32, 400u32);
        caught(f64::from(high) / 100.0)?;
        while high - low > 1 {
            let mid = (low + high) / 2;
            if caught(f64::from(mid) / 100.0).is_some() {
                high = mid;
            } else {
                low = mid;
            }
        }
        caught(f64::from(high) / 100.0)
    }
}

/// One device's pool as the host's bound needs it: its clock on the host's pooled sources
/// ([`Design::pooled_clock`]: `undetected` is the most of its pool the sources can hide before
/// its deadline), its openings, and its claim.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostPool {
    pub clock: Clocked,
    pub steps: u32,
    pub rows: u32,
    pub claimed_bytes: f64,
    /// The pool's share of the claim: its states' bytes over the claim, at most the design's
    /// `pool_share` (less where whole states or the pool's cap leave less).
    pub pool_share: f64,
}

/// Grid steps per device over the sources' budget: the host bound gives each pool at most one
/// step more than it could use, so the finer the grid, the less the bound gives away (about a
/// quarter of one device's `x*` per pool at 4).
const HOST_GRID_PER_DEVICE: usize = 4;

impl Design {
    /// The least share of the host's claimed memory (all its devices' claims together) that it
    /// is shown to hold of their pools, somewhere among its devices, with probability at least
    /// `1 - pass` against the best cheater (PROTOCOL.md 20.9 step 7).
    ///
    /// The host passes only if every device's openings pass, so it passes with more than `pass`
    /// only if every pool `j` is short by less than `thr_j(y_j)`: the least shortfall caught
    /// ([`Design::proven`]) when the sources hide `y_j` of that pool. The sources are shared:
    /// what hides one pool's reads cannot hide another's, so `sum y_j <= Y`, the most any one
    /// pool's clock hides (the sources' output over the longest deadline), and `y_j` at most
    /// pool `j`'s own `undetected`. The host's shortfall is at most the largest
    /// `sum_j claimed_j * thr_j(y_j)` under that budget; `thr_j` rises with `y`, so on a grid
    /// of `Y / (4d)` with every `y_j` rounded up to it (at most `d - 1` steps over the budget)
    /// a search over whole steps bounds it from above. `caught(clock, steps, rows)` is
    /// [`Design::proven`]'s `shortfall_caught` (the caller may remember it).
    pub fn host_held_share(&self, pools: &[HostPool], caught: &dyn Fn(Clocked, u32, u32) -> f64) -> f64 {
        let claimed: f64 = pools.iter().map(|p| p.claimed_bytes).sum();
        if pools.is_empty() || claimed <= 0.0 {
            return 0.0;
        }
        if let [pool] = pools {
            // One device: its own clock is the whole budget, and thr rises with it.
            return (pool.pool_share * (1.0 - caught(pool.clock, pool.steps, pool.rows).min(1.0))).max(0.0);
        }
        let budget = pools.iter().map(|p| p.clock.undetected).fold(0.0, f64::max);
        let grid = HOST_GRID_PER_DEVICE * pools.len();
        let step = budget / grid as f64;
        let units = grid + pools.len() - 1;
        // best[u]: the largest shortfall in bytes of pool of the pools so far with u steps.
        let mut best = vec![0.0f64; units + 1];
        // thr on the grid, per kind of pool: a host's like devices share one.
        let mut grids: std::collections::HashMap<(u64, u64, u32, u32), Vec<f64>> = Default::default();
        for pool in pools {
            let own = pool.clock.undetected;
            let key = (own.to_bits(), pool.clock.reads.to_bits(), pool.steps, pool.rows);
            let shares = grids.entry(key).or_insert_with(|| {
                // thr_j at k steps, the clock capped at the pool's own: k beyond that buys
                // nothing.
                let most = if step > 0.0 {
                    ((own / step).ceil() as usize).min(units)
                } else {
                    0
                };
                (0..=most)
                    .map(|k| {
                        let clock = Clocked {
                            undetected: (k as f64 * step).min(own),
                            reads: pool.clock.reads,
                        };
                        caught(clock, pool.steps, pool.rows).min(1.0)
                    })
                    .collect()
            });
            let pool_bytes = pool.pool_share * pool.claimed_bytes;
            let thr: Vec<f64> = shares.iter().map(|share| share * pool_bytes).collect();
            let most = thr.len() - 1;
            let mut next = vec![0.0f64; units + 1];
            for (used, slot) in next.iter_mut().enumerate() {
                *slot = (0..=most.min(used))
                    .map(|k| best[used - k] + thr[k])
                    .fold(0.0, f64::max);
            }
            best = next;
        }
        let pooled: f64 = pools.iter().map(|p| p.pool_share * p.claimed_bytes).sum();
        ((pooled - best.into_iter().fold(0.0, f64::max)) / claimed).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(x: f64) -> f64 {
        (x * 10_000.0).round() / 100.0
    }

    fn row(name: &str, sources: Sources) -> Sizing {
        VERSION_4.size(model(name).unwrap(), sources).unwrap()
    }

    /// The design's table 4.4, rows A to E, to its two decimals.
    #[test]
    fn the_clock_bounds_match_the_design_table() {
        let cases = [
            ("H100 SXM", Sources::Regenerate, 0.63),
            ("H100 SXM", Sources::HostLink, 2.61),
            ("H100 SXM", Sources::RegenerateAndHost, 3.24),
            ("H100 SXM", Sources::WithPeers, 21.89),
            ("H200", Sources::RegenerateAndHost, 2.26),
            ("A100 80GB SXM", Sources::RegenerateAndHost, 2.47),
            ("RTX 4090", Sources::HostLink, 4.34),
            ("RTX 4090", Sources::RegenerateAndHost, 5.04),
            ("GH200 96 GB", Sources::RegenerateAndGrace, 16.15),
            ("GH200 144 GB", Sources::RegenerateAndGrace, 13.19),
        ];
        for (name, sources, want) in cases {
            let got = pct(row(name, sources).undetected);
            assert!(
                (got - want).abs() <= 0.01,
                "{name} {sources:?}: x* {got}% against {want}%"
            );
        }
        assert_eq!(
            model("RTX 4090").unwrap().source_rate(Sources::WithPeers, 131_072.0),
            None
        );
        assert_eq!(
            model("GH200 96 GB").unwrap().source_rate(Sources::HostLink, 131_072.0),
            None
        );
    }

    /// The design's table 6.3: faked share, openings and row checks per model. (The table was
    /// first worked from `x*` rounded to two decimals; these are the unrounded figures, one to six
    /// openings fewer.)
    #[test]
    fn the_opening_counts_match_the_design_table() {
        let cases = [
            ("H100 SXM", Sources::RegenerateAndHost, 1.126, 468, 174),
            ("H200", Sources::RegenerateAndHost, 1.618, 325, 131),
            ("A100 80GB SXM", Sources::RegenerateAndHost, 1.509, 349, 138),
            ("RTX 4090", Sources::RegenerateAndHost, 0.350, 1512, 434),
            ("GH200 96 GB", Sources::Regenerate, 2.570, 204, 90),
        ];
        for (name, sources, phi, openings, rows) in cases {
            let sizing = row(name, sources);
            let got = sizing.faked.unwrap() * 100.0;
            assert!((got - phi).abs() < 0.0006, "{name}: phi_min {got}% against {phi}%");
            assert_eq!(sizing.openings, Some(openings), "{name}");
            assert_eq!(sizing.row_checks, Some(rows), "{name}");
        }
    }

    #[test]
    fn devices_are_sized_as_the_model_their_name_and_memory_say() {
        let of = |name: &str, bytes: u64| model_for_device(name, bytes).map(|m| m.name);
        assert_eq!(of("NVIDIA H100 80GB HBM3", 85_520_809_984), Some("H100 SXM"));
        assert_eq!(of("NVIDIA H200", 150_754_820_096), Some("H200"));
        assert_eq!(of("NVIDIA A100-SXM4-80GB", 85_899_345_920), Some("A100 80GB SXM"));
        assert_eq!(of("NVIDIA GeForce RTX 4090", 25_757_220_864), Some("RTX 4090"));
        assert_eq!(of("NVIDIA GH200 480GB", 102_625_681_408), Some("GH200 96 GB"));
        assert_eq!(of("NVIDIA GH200 144G HBM3e", 151_061_594_112), Some("GH200 144 GB"));
        assert_eq!(of("NVIDIA H100 PCIe", 85_520_809_984), Some("H100 PCIe"));
        assert_eq!(of("NVIDIA H100 NVL", 100_485_038_080), Some("H100 NVL"));
        assert_eq!(of("NVIDIA A100-SXM4-40GB", 42_505_273_344), Some("A100 40GB SXM"));
        assert_eq!(of("NVIDIA A100-PCIE-40GB", 42_505_273_344), Some("A100 40GB PCIe"));
        assert_eq!(of("NVIDIA A100 80GB PCIe", 85_899_345_920), Some("A100 80GB PCIe"));
        assert_eq!(of("NVIDIA L40S", 48_305_799_168), Some("L40S"));
        assert_eq!(of("NVIDIA L40", 48_305_799_168), Some("L40"));
        assert_eq!(of("NVIDIA L4", 24_152_899_584), Some("L4"));
        assert_eq!(of("NVIDIA A10", 24_152_899_584), Some("A10"));
        assert_eq!(of("NVIDIA GeForce RTX 3090", 25_769_803_776), Some("RTX 3090"));
        assert_eq!(
            of("NVIDIA RTX 6000 Ada Generation", 51_527_024_640),
            Some("RTX 6000 Ada")
        );
        for other in ["NVIDIA H200 NVL", "NVIDIA B200", "NVIDIA A40", "cpu: AMD EPYC"] {
            assert_eq!(of(other, 80_000_000_000), None, "{other}");
        }
        assert_eq!(bound_model("cpu", "cpu: AMD EPYC", 1 << 30), &CPU);
        assert_eq!(bound_model("cuda", "NVIDIA B200", 190_000_000_000), &UNKNOWN_GPU);
        assert_eq!(bound_model("cuda", "NVIDIA L40S", 48_305_799_168).name, "L40S");
        // Only the design's table sizes openings: a part added for its bound does not move the
        // cap every unlisted device is opened with.
        assert!(MODELS.iter().all(sizes_openings));
        assert!(!OTHER_MODELS.iter().any(sizes_openings));
        assert_eq!(
            sized_sources(model("GH200 96 GB").unwrap()),
            Sources::RegenerateAndGrace
        );
        assert_eq!(sized_sources(model("H100 SXM").unwrap()), Sources::RegenerateAndHost);
    }

    /// The best mixed cheater passes the single-strategy counts more often than `pass` (design
    /// 6.4), and the mixed counts catch it: at the design's clock they prove the 90% holder
    /// caught on every model, and half of them do not. At first contact the same counts prove
    /// less, and more openings prove more.
    #[test]
    fn the_proven_bound_follows_the_clock_and_the_openings() {
        let d = VERSION_4;
        // A GH200's clock hides more than the 90% holder's shortfall once Grace is counted:
        // no count catches it there (see the GH200 test below).
        for m in MODELS.iter().filter(|m| m.c2c.is_none()) {
            let sources = sized_sources(m);
            let clock = d.clocked(m, sources, d.slack, d.eta).unwrap();
            let sizing = d.size(m, sources).unwrap();
            let (s0, q0) = (sizing.openings.unwrap(), sizing.row_checks.unwrap());
            let x = shortfall_holding(0.9, d.pool_share);
            let (single, g) = mixed_pass(x, clock.undetected, clock.reads, s0, q0);
            assert!(
                single > d.pass && g > 0.0,
                "{}: the mix passes {single} at g = {g}",
                m.name
            );
            let (steps, rows) = d.mixed_counts(clock).unwrap();
            assert!(
                steps >= s0 && rows >= q0 && steps < 2 * s0,
                "{}: {steps} {rows}",
                m.name
            );
            assert!(mixed_pass(x, clock.undetected, clock.reads, steps, rows).0 <= d.pass);
            let at_design = d.proven(clock, steps, rows);
            assert!(at_design.held_at_least >= 0.9 - 1e-9, "{}: {at_design:?}", m.name);
            assert!((at_design.undetected - sizing.undetected).abs() < 1e-12);
            let fewer = d.proven(clock, steps / 2, rows / 2);
            assert!(fewer.held_at_least < 0.9, "{}: {fewer:?}", m.name);
        }
        let h100 = model("H100 SXM").unwrap();
        let first = d.clocked(h100, Sources::RegenerateAndHost, 2.0, 0.75).unwrap();
        // x* = 2 / 0.75 * 78.1 / 3350 = 6.22%: catching the 90% holder's last 0.03% would take
        // a hundred times the worst row's openings.
        assert!((first.undetected - 0.0622).abs() < 0.0001, "{first:?}");
        let needed = d.mixed_counts(first).unwrap();
        assert!(needed.0 > 100 * 1512, "{needed:?}");
        let rtx = model("RTX 4090").unwrap();
        let hidden = d.clocked(rtx, Sources::RegenerateAndHost, 2.0, 0.75).unwrap();
        assert_eq!(
            d.mixed_counts(hidden),
            None,
            "x* {} is past the shortfall",
            hidden.undetected
        );
        let opened = d.proven(first, 468, 174);
        assert!(opened.held_at_least < 0.9 && opened.held_at_least > 0.85, "{opened:?}");
        assert!(d.proven(first, 1512, 434).held_at_least > opened.held_at_least);
        // A clock that hides everything proves nothing.
        let blind = d.clocked(h100, Sources::RegenerateAndHost, 100.0, 0.01).unwrap();
        let nothing = d.proven(blind, 468, 174);
        assert_eq!((nothing.shortfall_caught, nothing.held_at_least), (1.0, 0.0));
        assert_eq!(d.clocked(h100, Sources::RegenerateAndGrace, 1.25, 0.9), None);
    }

    /// A GH200's Grace memory over C2C is counted: its clock hides 16.15% (design row D) at the
    /// design's clock, so the 90% holder is not claimed caught, and what a pass proves is about
    /// four fifths of its claim there and two thirds at first contact, not 90%.
    #[test]
    fn a_gh200_bound_counts_its_grace_memory() {
        let d = VERSION_4;
        // (model, held at the design's clock, held at first contact: S 2 over 0.75)
        for (name, design, first) in [("GH200 96 GB", 0.7909, 0.644), ("GH200 144 GB", 0.8200, 0.699)] {
            let m = model(name).unwrap();
            let clock = d.clocked(m, sized_sources(m), d.slack, d.eta).unwrap();
            assert_eq!(d.mixed_counts(clock), None, "{name}: x* {}", clock.undetected);
            let held = d.proven(clock, 1649, 474).held_at_least;
            assert!((held - design).abs() < 0.0005, "{name}: {held}");
            let at_first = d.clocked(m, sized_sources(m), 2.0, 0.75).unwrap();
            let held = d.proven(at_first, 1649, 474).held_at_least;
            assert!((held - first).abs() < 0.0005, "{name}: {held}");
            let without_grace = d.clocked(m, Sources::Regenerate, d.slack, d.eta).unwrap();
            assert!(d.proven(without_grace, 1649, 474).held_at_least > 0.9);
        }
    }

    /// Walkers move between a host's devices, so a pool's bound counts every device's sources
    /// and bandwidth. One device alone is exactly its own clock; two H100s that claim to be one
    /// H200 are held to the whole host's sources, and each pool's bound is weaker than one
    /// device's.
    #[test]
    fn a_pooled_clock_counts_every_device_of_the_host() {
        let d = VERSION_4;
        let h100 = model("H100 SXM").unwrap();
        let h200 = model("H200").unwrap();
        let alone = d.pooled_clock(h100, &[h100], 1.5, 0.9);
        assert_eq!(alone, d.clocked(h100, sized_sources(h100), 1.5, 0.9).unwrap());
        let pair = d.pooled_clock(h100, &[h100, h100], 1.5, 0.9);
        assert!((pair.undetected - 2.0 * alone.undetected).abs() < 1e-12);
        assert!((pair.reads - 2.0 * alone.reads).abs() < 1e-12);
        let (one, two) = (d.proven(alone, 497, 185), d.proven(pair, 497, 185));
        assert!(two.held_at_least < one.held_at_least - 0.02, "{one:?} {two:?}");
        // A claimed H200 beside an H100: the H200's pool is held to both devices' sources.
        let mixed = d.pooled_clock(h200, &[h200, h100], 1.5, 0.9);
        let own = d.clocked(h200, sized_sources(h200), 1.5, 0.9).unwrap();
        assert!(mixed.undetected > own.undetected && mixed.reads > own.reads);
    }

    /// The host's bound: one device alone is its own bound; on a host of like devices it lies
    /// between the bound that gives every pool all the sources (each device's own, pooled) and
    /// what one device alone proves, and it is a bound: no split of the sources beats it.
    #[test]
    fn the_host_bound_shares_the_sources_between_the_pools() {
        let d = VERSION_4;
        let h100 = model("H100 SXM").unwrap();
        let caught = |clock: Clocked, steps: u32, rows: u32| d.proven(clock, steps, rows).shortfall_caught;
        let (steps, rows) = (788, 238);
        let pool = |host: &[&DeviceModel]| HostPool {
            clock: d.pooled_clock(h100, host, 1.5, 0.9),
            steps,
            rows,
            claimed_bytes: 80e9,
            pool_share: d.pool_share,
        };
        let alone = d.proven(d.pooled_clock(h100, &[h100], 1.5, 0.9), steps, rows);
        let one = d.host_held_share(&[pool(&[h100])], &caught);
        assert!((one - alone.held_at_least).abs() < 1e-12, "{one} {alone:?}");

        let host = [h100; 4];
        let pools = [pool(&host); 4];
        let shared = d.host_held_share(&pools, &caught);
        let each_all = d.proven(pools[0].clock, steps, rows).held_at_least;
        assert!(
            shared > each_all + 0.05 && shared < alone.held_at_least,
            "host {shared}, every pool with every source {each_all}, one alone {}",
            alone.held_at_least
        );
        // No split of the sources' budget passes a larger shortfall than the bound allows: all
        // on one pool, evenly, and in between.
        let budget = pools[0].clock.undetected;
        for split in [
            [1.0, 0.0, 0.0, 0.0],
            [0.25; 4],
            [0.5, 0.5, 0.0, 0.0],
            [0.7, 0.1, 0.1, 0.1],
        ] {
            let short: f64 = split
                .iter()
                .map(|&share| {
                    let clock = Clocked {
                        undetected: share * budget,
                        reads: pools[0].clock.reads,
                    };
                    caught(clock, steps, rows)
                })
                .sum::<f64>()
                / 4.0;
            assert!(
                d.pool_share * (1.0 - short) >= shared - 1e-9,
                "{split:?}: {} below the bound {shared}",
                d.pool_share * (1.0 - short)
            );
        }
    }

    /// Every device gets a bound: a listed part from its datasheet, an unlisted GPU as the
    /// strongest GPU known, a CPU as host memory a network away. A CPU's hash-paced walk
    /// proves nothing of its memory at the shipped rates, and its bound says so (0).
    #[test]
    fn every_device_has_a_bound() {
        let d = VERSION_4;
        let l40s = model("L40S").unwrap();
        let clock = d.pooled_clock(l40s, &[l40s], 1.5, 0.9);
        let held = d.proven(clock, 1649, 474).held_at_least;
        assert!(held > 0.85 && held < 0.96, "{held}");
        // Two cores walking at 2 GB/s each, at first contact.
        let cpu = d.pooled_clock(&CPU, &[&CPU], 2.0, 4e9 / CPU.bandwidth);
        assert!(cpu.undetected > 1.0, "{cpu:?}");
        assert_eq!(d.proven(cpu, 1649, 474).held_at_least, 0.0);
        let unknown = d.pooled_clock(&UNKNOWN_GPU, &[&UNKNOWN_GPU], 1.5, 0.9);
        let held = d.proven(unknown, 1649, 474).held_at_least;
        assert!((0.0..0.96).contains(&held), "{held}");
    }

    #[test]
    fn grinding_lowers_the_faked_share_below_the_naive_one() {
        // The design's worked case: x = 6.25%, f = 1%: 0.89% without grinding, 0.273% with it.
        let x = 0.0625;
        let phi = least_faked_share(x, x - 0.01, 1.25 / 0.9).unwrap();
        assert!((phi * 100.0 - 0.273).abs() < 0.001, "{phi}");
        assert!(phi < 0.01 / (1.0 + 2.0 * x));
        // A larger budget of spare reads lets the cheater grind more, and fake less.
        assert!(least_faked_share(x, x - 0.01, 2.0).unwrap() < phi);
    }

    #[test]
    fn nothing_to_fake_where_the_clock_hides_the_whole_shortfall() {
        assert_eq!(least_faked_share(0.05, 0.05, 1.4), None);
        assert_eq!(least_faked_share(0.05, 0.2, 1.4), None);
        assert!(row("H100 SXM", Sources::WithPeers).faked.is_none());
        assert!(row("H100 SXM", Sources::WithPeers).openings.is_none());
    }

    #[test]
    fn openings_follow_the_pass_probability() {
        assert_eq!(openings_for(0.01, 0.005), 528);
        assert!(openings_for(0.01, 0.001) > openings_for(0.01, 0.005));
        assert_eq!(shortfall_holding(0.9, 0.96), 1.0 - 0.9 / 0.96);
        assert_eq!(shortfall_holding(0.99, 0.96), 0.0);
    }
}
