//! Quoting a word of a command the CLI suggests (`pgwake queue resume NAME`),
//! so that pasting it into a shell passes NAME as one argument, whatever it
//! holds: spaces, commas, quotes, `$`, globs, control characters.

use std::borrow::Cow;

/// `word` as a POSIX shell word that the shell turns back into exactly
/// `word`:
/// - bare when it is made only of `A-Z a-z 0-9 _ . / : @ % + = -` (and does
///   not start with `=`, which zsh expands to a command's path);
/// - else in single quotes, a `'` inside written `'\''`;
/// - with a control or bidirectional-text control character, as `$'…'`
///   (bash, zsh, ksh, and POSIX shells since 2024), those characters as
///   `\xHH` escapes of their UTF-8 bytes, so that printing the suggestion
///   never writes a raw control character to the terminal.
///
/// The empty word is `''`.
pub fn quote(word: &str) -> Cow<'_, str> {
    let bare = |c: char| c.is_ascii_alphanumeric() || "_./:@%+=-".contains(c);
    if !word.is_empty() && word.chars().all(bare) && !word.starts_with('=') {
        return Cow::Borrowed(word);
    }
    if word.chars().any(needs_escape) {
        let mut out = String::from("$'");
        for c in word.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                c if needs_escape(c) => {
                    // Byte by byte (UTF-8): `\u` would depend on the locale.
                    let mut buf = [0; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\x{b:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('\'');
        return Cow::Owned(out);
    }
    Cow::Owned(format!("'{}'", word.replace('\'', r"'\''")))
}

/// Characters never written raw: control characters (C0, DEL, C1) and the
/// bidirectional-text controls that reorder what a terminal shows.
fn needs_escape(c: char) -> bool {
    c.is_control() || pgwake::admin::stats::is_bidi_control(c)
}

/// A positional argument of a suggested command: [`quote`]d, and after `--`
/// when it starts with `-`, which the command would otherwise take for a flag.
pub fn positional(word: &str) -> String {
    let quoted = quote(word);
    if word.starts_with('-') {
        format!("-- {quoted}")
    } else {
        quoted.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What bash makes of `printf '%s\0' WORD…`: the words it was given.
    fn bash_words(script_words: &str) -> Vec<String> {
        let o = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf '%s\\0' {script_words}"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(o.stdout).unwrap();
        out.split_terminator('\0').map(str::to_string).collect()
    }

    #[test]
    fn plain_names_stay_bare() {
        for w in ["default", "reports-eu.2", "a/b:c@d%e+f=g", "x_1"] {
            assert_eq!(quote(w), w);
        }
        assert_eq!(quote(""), "''");
        assert_eq!(quote("=x"), "'=x'");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("a\tb"), r"$'a\x09b'");
    }

    #[test]
    fn every_quoted_word_reads_back_as_itself_in_bash() {
        let words = [
            "my queue",
            "a,b",
            "it's",
            "$HOME",
            "`id`",
            "a b,c'd$e",
            "*",
            "~",
            "=ls",
            "-x",
            "\\",
            "",
            "new\nline",
            "tab\there",
            "esc\u{1b}[31m",
            "del\u{7f}",
            "c1\u{85}",
            "bidi\u{202e}txt",
            "ünïcødé 名前",
            "'\\'\"",
        ];
        let script: Vec<String> = words.iter().map(|w| quote(w).into_owned()).collect();
        assert_eq!(bash_words(&script.join(" ")), words);
        for w in words {
            let q = quote(w);
            assert!(!q.chars().any(needs_escape), "raw control in {q:?}");
        }
    }

    #[test]
    fn a_positional_starting_with_a_dash_follows_double_dash() {
        assert_eq!(positional("-x"), "-- -x");
        assert_eq!(positional("-a b"), "-- '-a b'");
        assert_eq!(positional("a b"), "'a b'");
    }
}
