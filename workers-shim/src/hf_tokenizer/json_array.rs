//! The elements of a JSON array, found by its structure alone: brackets, commas and
//! strings, the strings skipped with `memchr` (the inside of an agent's message is most
//! of its bytes, and a quote or backslash is all that can end or escape a string).
//!
//! It does not read the elements: a caller that needs them valid checks each one (parses
//! it, or finds it equal to one parsed before). That makes the whole check complete: text
//! shaped `[ e₁ , e₂ , … ]` (whitespace between) whose every `eᵢ` is a JSON value is a
//! JSON array. And for such text the split is serde's own: a valid element's strings
//! begin and end where this scan's do, so no comma or bracket inside one is taken for
//! the array's.
//!
//! Why not serde: splitting a 171 KB conversation into `Vec<&RawValue>` read every string
//! byte by byte through the deserializer and was ~8% of the router's work on an agent
//! session step (`bench proxy --peers`, sessions 171 KB, `perf`); the scan here is a
//! fraction of that.

/// The elements of `json` as written (without the whitespace around them), or `None`
/// when it is not shaped as an array of non-empty elements (unbalanced brackets, an
/// unclosed string, an empty element, anything after the closing bracket but
/// whitespace). Elements are not validated (see the module doc).
pub(super) fn elements(json: &str) -> Option<Vec<&str>> {
    let bytes = json.as_bytes();
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'[') {
        return None;
    }
    at = skip_ws(bytes, at + 1);
    let mut out = Vec::new();
    if bytes.get(at) == Some(&b']') {
        return (skip_ws(bytes, at + 1) == bytes.len()).then_some(out);
    }
    loop {
        let start = at;
        let (end, closing) = element_end(bytes, start)?;
        let element = json.get(start..end)?.trim_end_matches(is_ws_char);
        if element.is_empty() {
            return None;
        }
        out.push(element);
        at = skip_ws(bytes, end + 1);
        if closing {
            return (at == bytes.len()).then_some(out);
        }
    }
}

/// Where the element starting at `from` ends: the index of the `,` or `]` after it at
/// the array's depth, and whether it was the `]`.
fn element_end(bytes: &[u8], from: usize) -> Option<(usize, bool)> {
    let mut depth = 0usize;
    let mut at = from;
    while let Some(&b) = bytes.get(at) {
        match b {
            b'"' => at = string_end(bytes, at + 1)?,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth > 0 => depth -= 1,
            b']' => return Some((at, true)),
            b'}' => return None,
            b',' if depth == 0 => return Some((at, false)),
            _ => {}
        }
        at += 1;
    }
    None
}

/// The index of the quote closing a string whose contents start at `from`.
fn string_end(bytes: &[u8], mut from: usize) -> Option<usize> {
    loop {
        let at = from + memchr::memchr2(b'"', b'\\', bytes.get(from..)?)?;
        if bytes[at] == b'"' {
            return Some(at);
        }
        // A backslash escapes the byte after it (`\"`, `\\`, `\u`…).
        from = at + 2;
    }
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(|b| is_ws(*b)) {
        at += 1;
    }
    at
}

/// JSON's whitespace.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_ws_char(c: char) -> bool {
    u8::try_from(c).is_ok_and(is_ws)
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;

    /// serde's split, the reference.
    fn serde_split(json: &str) -> Option<Vec<&str>> {
        serde_json::from_str::<Vec<&RawValue>>(json)
            .ok()
            .map(|v| v.into_iter().map(RawValue::get).collect())
    }

    #[test]
    fn valid_arrays_split_as_serde_splits_them() {
        let cases = [
            "[]",
            " [ ] \n",
            "[1]",
            "[1,2 , 3]",
            r#"[{"role":"user","content":"a, b ] } { [ \" \\"}, {"x":[1,[2,{"y":"]"}]]}]"#,
            "\t[ \"\\\\\" , \"\\\"]\" ,null,true,-1.5e3,{}] ",
            r#"[{"content":"é ü \u00e9 — 🙂, ]"}]"#,
            "[[],[[]],{\"a\":{}}]",
        ];
        for json in cases {
            assert_eq!(elements(json), serde_split(json), "{json}");
        }
    }

    /// Random valid arrays of messages, with every JSON character that could confuse a
    /// scan in their strings, split as serde splits them.
    #[test]
    fn random_conversations_split_as_serde_splits_them() {
        let alphabet = [
            'a', ' ', ',', '[', ']', '{', '}', '"', '\\', '\n', 'é', ':', 'u',
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..500 {
            let messages: Vec<serde_json::Value> = (0..next(6))
                .map(|_| {
                    let text: String = (0..next(40)).map(|_| alphabet[next(alphabet.len())]).collect();
                    serde_json::json!({"role": "user", "content": text, "n": [next(9), {"k": text}]})
                })
                .collect();
            let compact = serde_json::to_string(&messages).unwrap();
            let pretty = serde_json::to_string_pretty(&messages).unwrap();
            for json in [compact, pretty] {
                assert_eq!(elements(&json), serde_split(&json), "{json}");
            }
        }
    }

    /// What is not shaped as an array of elements is not split (the caller falls back to
    /// serde, which says why).
    #[test]
    fn text_not_shaped_as_an_array_is_not_split() {
        for json in [
            "",
            "{}",
            "\"[1]\"",
            "[1,]",
            "[,1]",
            "[1,,2]",
            "[1",
            "[1}",
            "[{\"a\":1}}]",
            "[\"open]",
            "[\"ends in a backslash\\",
            "[1] x",
            "[1][2]",
        ] {
            assert_eq!(elements(json), None, "{json:?}");
        }
    }
}
