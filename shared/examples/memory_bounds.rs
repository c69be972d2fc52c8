//! Prints the version 4 memory bounds (docs/design/protocol-v4.md, tables 4.4 and 6.3) from the
//! arithmetic in `gpu_attest_shared::memory::bound`, so that each figure can be checked.

use gpu_attest_shared::memory::bound::{MODELS, Sources, VERSION_4};

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
}
