//! Text from outside the validator is stored and shown to operators. A miner's own words (a
//! status message) are made safe first: control and bidirectional-format characters are escaped,
//! so that it cannot rewrite a terminal line or reorder what is shown, and its length is bounded,
//! so that it cannot grow the database. The inventory's text fields need none of this: the
//! protocol holds them to printable ASCII within limits (`Inventory::check`). Text an API caller
//! gives (a miner's name, a revocation reason) is refused instead when it would need escaping.

/// The most characters of a miner's message that are kept.
pub const MAX_MINER_TEXT_CHARS: usize = 512;

/// `text` with every control or bidirectional-format character escaped (`\n`, `\u{1b}`) and
/// cut after [`MAX_MINER_TEXT_CHARS`] characters, saying how much more there was.
pub fn miner_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(MAX_MINER_TEXT_CHARS));
    for (count, (at, c)) in text.char_indices().enumerate() {
        if count == MAX_MINER_TEXT_CHARS {
            out.push_str(&format!("... ({} more bytes)", text.len() - at));
            break;
        }
        if c.is_control() || is_bidi_format(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Why `text`, given by an API caller for the field `field` (a miner's name, a revocation
/// reason), cannot be stored: longer than `max_bytes`, or holding a control or
/// bidirectional-format character. Such text is refused rather than escaped, since the caller
/// can send it again as meant; the reason quotes none of it.
pub fn caller_text_problem(field: &str, text: &str, max_bytes: usize) -> Option<String> {
    if text.len() > max_bytes {
        return Some(format!("{field} is {} bytes; at most {max_bytes} are kept", text.len()));
    }
    text.chars().find(|&c| c.is_control() || is_bidi_format(c)).map(|c| {
        format!(
            "{field} holds U+{:04X}: control and bidirectional-format characters are refused",
            u32::from(c)
        )
    })
}

/// The characters that change the order in which a terminal shows text (Unicode's bidirectional
/// marks, embeddings, overrides and isolates), break its lines (the line and paragraph
/// separators), or hide text (zero-width and invisible format characters, fillers, tags).
fn is_bidi_format(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_kept() {
        assert_eq!(miner_text("nonce already used"), "nonce already used");
        assert_eq!(miner_text("GPU fault: Xid 79 — retry"), "GPU fault: Xid 79 — retry");
        assert_eq!(
            miner_text("\r\u{1b}[2K#999 PASS\nverdict: pass\0"),
            "\\r\\u{1b}[2K#999 PASS\\nverdict: pass\\u{0}"
        );
        assert_eq!(miner_text("abc\u{202E}fed"), "abc\\u{202e}fed");
    }

    #[test]
    fn caller_text_is_refused_when_it_would_need_escaping() {
        assert_eq!(caller_text_problem("name", "rig-1 (München)", 128), None);
        let problem = caller_text_problem("name", "rig\u{1b}[2J", 128).unwrap();
        assert_eq!(
            problem,
            "name holds U+001B: control and bidirectional-format characters are refused"
        );
        assert!(caller_text_problem("name", "a\u{202E}b", 128).is_some());
        assert!(caller_text_problem("name", "a\nb", 128).is_some());
        for hidden in ['\u{2028}', '\u{061C}', '\u{E0041}', '\u{3164}', '\u{00AD}', '\u{2060}'] {
            assert!(
                caller_text_problem("name", &format!("a{hidden}b"), 128).is_some(),
                "{hidden:?}"
            );
        }
        let long = caller_text_problem("reason", &"x".repeat(513), 512).unwrap();
        assert_eq!(long, "reason is 513 bytes; at most 512 are kept");
    }

    #[test]
    fn long_text_is_cut_and_says_how_much_was_left() {
        let long = "é".repeat(MAX_MINER_TEXT_CHARS + 10);
        let kept = miner_text(&long);
        assert!(kept.starts_with(&"é".repeat(MAX_MINER_TEXT_CHARS)), "{kept}");
        assert!(kept.ends_with("... (20 more bytes)"), "{kept}");
        assert_eq!(
            miner_text(&"x".repeat(MAX_MINER_TEXT_CHARS)),
            "x".repeat(MAX_MINER_TEXT_CHARS)
        );
    }
}
