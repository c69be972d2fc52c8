//! Prints the version 4 memory bounds (docs/design/protocol-v4.md, tables 4.4 and 6.3) from the
//! arithmetic in `gpu_attest_shared::memory::bound`, so that each figure can be checked.

use gpu_attest_shared::memory::bound::{
    CPU, DeviceModel, HostPool, MODELS, Sources, UNKNOWN_GPU, VERSION_4, models, sized_sources,
};

fn main() {
    let d = VERSION_4;
    println!(
        "pool share {}, kappa {}, slack {}, eta {}, openings sized for a pass of {}",
        d.pool_share, d.kappa, d.slack, d.eta, d.pass
    );
    println!(
        "| device | sources | sum r_i, GB/s | x* | held share that passes | faked share | openings | row checks |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let rows = [
        Sources::Regenerate,
        Sources::HostLink,
        Sources::RegenerateAndHost,
        Sources::RegenerateAndGrace,
        Sources::WithPeers,
    ];
    for model in MODELS {
        for sources in rows {
            let (Some(rate), Some(sizing)) = (model.source_rate(sources, d.kappa), d.size(model, sources)) else {
                continue;
            };
            let count = |v: Option<u32>| v.map_or("-".to_string(), |v| v.to_string());
            println!(
                "| {} | {:?} | {:.1} | {:.2}% | {:.1}% | {} | {} | {} |",
                model.name,
                sources,
                rate / 1e9,
                sizing.undetected * 100.0,
                d.pool_share * (1.0 - sizing.undetected) * 100.0,
                sizing
                    .faked
                    .map_or("clock misses 90%".to_string(), |phi| format!("{:.3}%", phi * 100.0)),
                count(sizing.openings),
                count(sizing.row_checks),
            );
        }
    }
    println!();
    println!("Against the best mixed cheater (design 6.4: cheap states for part of the shortfall, faked");
    println!("and ground steps for the rest), the counts that catch the 90% holder with probability");
    println!(
        "{}, and what a verdict states per device (`held_at_least`: the share of its claim below",
        1.0 - d.pass
    );
    println!("which it is caught so), at the design's clock and at first contact (S 2.0 over 0.75 of");
    println!("the datasheet; the counts raised as far as the worst row's):");
    println!(
        "| device | sources | mixed counts (steps, rows) | held_at_least, calibrated | x*, first contact | held_at_least, first contact |"
    );
    println!("|---|---|---|---|---|---|");
    let counts: Vec<_> = MODELS
        .iter()
        .map(|m| {
            d.clocked(m, sized_sources(m), d.slack, d.eta)
                .and_then(|c| d.mixed_counts(c))
        })
        .collect();
    let worst = counts
        .iter()
        .flatten()
        .fold((0, 0), |(s, r), &(cs, cr)| (s.max(cs), r.max(cr)));
    for (model, counts) in MODELS.iter().zip(counts) {
        let sources = sized_sources(model);
        let (Some((steps, rows)), Some(clock), Some(first)) = (
            counts,
            d.clocked(model, sources, d.slack, d.eta),
            d.clocked(model, sources, 2.0, 0.75),
        ) else {
            continue;
        };
        let raised = d.opened((steps, rows), first, worst);
        println!(
            "| {} | {:?} | {steps}, {rows} | {:.2}% | {:.2}% | {:.2}% ({}, {}) |",
            model.name,
            sources,
            d.proven(clock, steps, rows).held_at_least * 100.0,
            first.undetected * 100.0,
            d.proven(first, raised.0, raised.1).held_at_least * 100.0,
            raised.0,
            raised.1,
        );
    }
    hosts(&d);
}

/// What a verdict states per device on hosts of one to sixteen like devices (PROTOCOL.md 20.9
/// step 7: every device's sources count for each pool, since walkers move between devices),
/// calibrated (the GPU slack `S` 1.25 over 0.9 of the datasheet, and over 0.88, the share an
/// H200's attested walks reached) and at first contact (`S` 2.0 over 0.75), opened as this
/// release opens them. Other parts and the envelopes, opened as the cap.
fn hosts(d: &gpu_attest_shared::memory::bound::Design) {
    let cap = MODELS
        .iter()
        .filter_map(|m| {
            d.clocked(m, sized_sources(m), d.slack, d.eta)
                .and_then(|c| d.mixed_counts(c))
        })
        .fold((0, 0), |(s, r), (cs, cr)| (s.max(cs), r.max(cr)));
    println!();
    println!("Per host of d like devices: what the host is shown to hold of its claim, as");
    println!("`memory.host_held_at_least` states it (the sources shared between the pools), and after the");
    println!("slash what each device's `walk.held_at_least` states (every source on its pool alone):");
    println!("| device | clock (steps, rows) | d = 1 | d = 2 | d = 4 | d = 8 | d = 16 |");
    println!("|---|---|---|---|---|---|---|");
    let models: Vec<&DeviceModel> = models().chain([&UNKNOWN_GPU, &CPU]).collect();
    let caught = |clock, steps, rows| d.proven(clock, steps, rows).shortfall_caught;
    for model in models {
        let clocks = [
            ("calibrated", d.slack, d.eta),
            ("calibrated, eta 0.88", d.slack, 0.88),
            ("first contact", 2.0, 0.75),
        ];
        for (clock_name, slack, eta) in clocks {
            let own = d.clocked(model, sized_sources(model), slack, eta);
            let design = d
                .clocked(model, sized_sources(model), d.slack, d.eta)
                .and_then(|c| d.mixed_counts(c))
                .filter(|_| MODELS.iter().any(|m| m.name == model.name));
            let (steps, rows) = match (design, own) {
                (Some(base), Some(own)) => d.opened(base, own, cap),
                _ => cap,
            };
            let cells: Vec<String> = [1usize, 2, 4, 8, 16]
                .iter()
                .map(|&n| {
                    let host = vec![model; n];
                    let clock = d.pooled_clock(model, &host, slack, eta);
                    let pool = HostPool {
                        clock,
                        steps,
                        rows,
                        claimed_bytes: 1.0,
                        pool_share: d.pool_share,
                    };
                    format!(
                        "{:.1}% / {:.1}%",
                        d.host_held_share(&vec![pool; n], &caught) * 100.0,
                        d.proven(clock, steps, rows).held_at_least * 100.0
                    )
                })
                .collect();
            println!(
                "| {} | {clock_name} ({steps}, {rows}) | {} |",
                model.name,
                cells.join(" | ")
            );
        }
    }
}
