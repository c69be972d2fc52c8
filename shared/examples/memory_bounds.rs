//! Prints the version 4 memory bounds (docs/design/protocol-v4.md, tables 4.4 and 6.3) from the
//! arithmetic in `gpu_attest_shared::memory::bound`, so that each figure can be checked.

use gpu_attest_shared::memory::bound::{MODELS, Sources, VERSION_4, sized_sources};

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
    println!("What a verdict states per device (`held_at_least`): the share of its claim below which it");
    println!(
        "is caught with probability {}, against its sized sources, with the calibrated counts:",
        1.0 - d.pass
    );
    println!(
        "| device | sources | calibrated (S {}, eta {}) | first contact (S 2.0, eta 0.75) | first contact, openings raised to the worst row |",
        d.slack, d.eta
    );
    println!("|---|---|---|---|---|");
    let worst = MODELS
        .iter()
        .filter_map(|m| d.size(m, sized_sources(m)))
        .fold((0, 0), |(s, r), z| {
            (s.max(z.openings.unwrap_or(0)), r.max(z.row_checks.unwrap_or(0)))
        });
    for model in MODELS {
        let sources = sized_sources(model);
        let Some(sizing) = d.size(model, sources) else { continue };
        let (Some(steps), Some(rows)) = (sizing.openings, sizing.row_checks) else {
            continue;
        };
        let held = |slack: f64, eta: f64, steps: u32, rows: u32| {
            d.proven(model, sources, slack, eta, steps, rows)
                .map_or("-".to_string(), |p| format!("{:.2}%", p.held_at_least * 100.0))
        };
        println!(
            "| {} | {:?} | {} | {} | {} |",
            model.name,
            sources,
            held(d.slack, d.eta, steps, rows),
            held(2.0, 0.75, steps, rows),
            held(2.0, 0.75, worst.0, worst.1),
        );
    }
}
