//! Shell quoting of placeholder values: data never becomes code.
//!
//! A string `run` (or check) is a shell script run by `/bin/sh -c`; its
//! `{params.X}`, `{in.X}`, `{out.X}` and `{item.X}` values are data, often
//! scraped and hostile. Each value reaches the shell as exactly the bytes it
//! holds, as one word, whatever those bytes are. How a value must be quoted
//! depends on where the placeholder stands in the script, so the script is
//! lexed first (quotes, backslashes, `$(…)`, comments, here-documents) and
//! each placeholder gets the quoting of its context:
//!
//! | where the placeholder stands | what the value becomes                         |
//! |------------------------------|------------------------------------------------|
//! | outside quotes               | one word: bare if plainly safe (`state/a.json`), else `'…'` with `'` as `'\''` |
//! | inside `'…'`                 | the value with `'` written `'\''`              |
//! | inside `"…"`                 | the value with `$ ` `` ` `` `" \` backslash-escaped |
//! | inside `$((…))`              | an integer, or refused                         |
//! | inside a `#` comment         | not expanded (the placeholder stays as text)   |
//!
//! `$(…)` opens a fresh context, so `"$(cat '{in.x}')"` quotes for `'…'`.
//! Places where no quoting is safe are refused when the manifest is loaded:
//! inside backquotes, inside `${…}`, inside `$'…'`, in a here-document, or
//! right after a `$` or a backslash. A list value (a param that is a TOML
//! array) becomes one word per element, and so may only stand outside
//! quotes. A value holding a NUL byte cannot reach any command and is
//! refused.

use std::collections::HashMap;

use super::interpolate::{Placeholder, placeholder_at, walk};

/// Interpolates a shell script: `resolve(placeholder, context)` gives the
/// text that replaces a placeholder (quoted for its context, see
/// [`quote`]), or `None` to keep the placeholder as written. With
/// `keep_escapes` the result is still a template (its literal braces stay
/// `{{`/`}}`, as do those of inserted text), to be filled once more.
pub fn expand<'a, E>(
    script: &'a str,
    keep_escapes: bool,
    mut resolve: impl FnMut(&Placeholder<'a>, Result<Context, String>) -> Result<Option<String>, E>,
) -> Result<String, Vec<E>> {
    let contexts = contexts(script);
    walk(script, keep_escapes, |p| {
        let context = contexts
            .get(&p.range.start)
            .cloned()
            .unwrap_or_else(|| Err("where cairn cannot tell how to quote it".to_owned()));
        resolve(p, context)
    })
}

/// Where a placeholder stands in a shell script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Context {
    /// Outside quotes: the value becomes one word.
    Word,
    /// Inside `'…'`.
    SingleQuoted,
    /// Inside `"…"`.
    DoubleQuoted,
    /// Inside `$((…))`: only an integer is safe.
    Arithmetic,
    /// Inside a `#` comment: the placeholder is not expanded.
    Comment,
}

/// A value to place in a script: one string, or a list (several words).
#[derive(Debug, Clone, Copy)]
pub enum Value<'v> {
    One(&'v str),
    List(&'v [String]),
}

/// The context of every placeholder of `script`, by its start offset; a
/// placeholder where no quoting is safe maps to why.
pub fn contexts(script: &str) -> HashMap<usize, Result<Context, String>> {
    let mut lexer = Lexer {
        text: script,
        bytes: script.as_bytes(),
        i: 0,
        stack: vec![Frame::Command {
            parens: 0,
            nested: false,
        }],
        found: HashMap::new(),
        heredocs: Vec::new(),
        word_start: true,
        confused: None,
    };
    lexer.run();
    lexer.found
}

/// `value` quoted for `context`, or why it cannot be placed there.
pub fn quote(context: Context, value: Value<'_>) -> Result<String, String> {
    let words: &[String];
    let one;
    match value {
        Value::One(text) => {
            one = [text.to_owned()];
            words = &one;
        }
        Value::List(list) => {
            if context != Context::Word {
                return Err(
                    "a list becomes several words, so it can only stand outside quotes".to_owned(),
                );
            }
            words = list;
        }
    }
    if words.iter().any(|w| w.contains('\0')) {
        return Err("the value holds a NUL byte, which no command can receive".to_owned());
    }
    Ok(match context {
        Context::Word => words
            .iter()
            .map(|w| quote_word(w))
            .collect::<Vec<_>>()
            .join(" "),
        Context::SingleQuoted => words[0].replace('\'', r"'\''"),
        Context::DoubleQuoted => {
            let mut out = String::with_capacity(words[0].len());
            for c in words[0].chars() {
                if matches!(c, '$' | '`' | '"' | '\\') {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        }
        Context::Arithmetic => {
            let text = &words[0];
            let digits = text.strip_prefix('-').unwrap_or(text);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "`{text}` is not an integer, the only value safe inside `$((…))`"
                ));
            }
            text.clone()
        }
        Context::Comment => String::new(),
    })
}

/// Words the shell reads as syntax in command position; quoted so that a
/// value is always a plain word.
const RESERVED: &[&str] = &[
    "case", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if", "in", "select",
    "then", "time", "until", "while",
];

/// One shell word that stands for exactly `value`: bare when every byte is
/// plainly safe, else single-quoted.
pub fn quote_word(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./:@%+,-".contains(&b))
        && !RESERVED.contains(&value);
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\'', r"'\''"))
    }
}

enum Frame {
    /// Commands: the script itself or the inside of `$(…)` (`nested`).
    Command {
        parens: u32,
        nested: bool,
    },
    Double,
    Backquote,
    /// `${…}`.
    Parameter {
        braces: u32,
    },
    /// `$((…))`.
    Arithmetic {
        parens: u32,
    },
}

struct Heredoc {
    delimiter: String,
    strip_tabs: bool,
}

struct Lexer<'t> {
    text: &'t str,
    bytes: &'t [u8],
    i: usize,
    stack: Vec<Frame>,
    found: HashMap<usize, Result<Context, String>>,
    /// Here-documents whose bodies start after the next newline.
    heredocs: Vec<Heredoc>,
    word_start: bool,
    /// A construct the lexer does not follow precisely; every placeholder
    /// after it is refused.
    confused: Option<&'static str>,
}

/// What the script holds at one position, after cairn's own `{{`/`}}`
/// escapes.
enum Token<'t> {
    Placeholder(Placeholder<'t>),
    Char(char, usize),
}

impl<'t> Lexer<'t> {
    fn token(&self, at: usize) -> Option<Token<'t>> {
        let rest = self.bytes.get(at..)?;
        if rest.is_empty() {
            return None;
        }
        if rest.starts_with(b"{{") {
            return Some(Token::Char('{', 2));
        }
        if rest.starts_with(b"}}") {
            return Some(Token::Char('}', 2));
        }
        if let Some(p) = placeholder_at(self.text, at) {
            return Some(Token::Placeholder(p));
        }
        let c = self.text[at..].chars().next()?;
        Some(Token::Char(c, c.len_utf8()))
    }

    fn peek(&self, offset_chars: usize) -> Option<char> {
        let mut at = self.i;
        for _ in 0..offset_chars {
            match self.token(at)? {
                Token::Placeholder(p) => at = p.range.end,
                Token::Char(_, w) => at += w,
            }
        }
        match self.token(at)? {
            Token::Char(c, _) => Some(c),
            Token::Placeholder(_) => None,
        }
    }

    fn record(&mut self, p: &Placeholder<'_>, context: Result<Context, String>) {
        let context = match self.confused {
            Some(why) => Err(why.to_owned()),
            None => context,
        };
        self.found.entry(p.range.start).or_insert(context);
    }

    /// Refuses the placeholder at `at`, if one starts there (after a `$`
    /// or a backslash).
    fn refuse_placeholder_at(&mut self, at: usize, why: &str) -> bool {
        if self.bytes.get(at..).is_some_and(|r| r.starts_with(b"{{")) {
            return false;
        }
        match placeholder_at(self.text, at) {
            Some(p) => {
                self.found.insert(p.range.start, Err(why.to_owned()));
                self.i = p.range.end;
                true
            }
            None => false,
        }
    }

    fn run(&mut self) {
        while let Some(token) = self.token(self.i) {
            let context = match self.stack.last() {
                Some(Frame::Command { .. }) | None => Ok(Context::Word),
                Some(Frame::Double) => Ok(Context::DoubleQuoted),
                Some(Frame::Arithmetic { .. }) => Ok(Context::Arithmetic),
                Some(Frame::Backquote) => Err("inside backquotes; write `$(…)` instead".to_owned()),
                Some(Frame::Parameter { .. }) => {
                    Err("inside `${…}`; assign the value to a variable first".to_owned())
                }
            };
            match token {
                Token::Placeholder(p) => {
                    self.record(&p, context);
                    self.i = p.range.end;
                    self.word_start = false;
                }
                Token::Char(c, width) => match self.stack.last() {
                    Some(Frame::Command { .. }) | None => self.command_char(c, width),
                    Some(Frame::Double) => self.double_char(c, width),
                    Some(Frame::Backquote) => self.backquote_char(c, width),
                    Some(Frame::Parameter { .. }) => self.parameter_char(c, width),
                    Some(Frame::Arithmetic { .. }) => self.arithmetic_char(c, width),
                },
            }
        }
    }

    /// Skips a backslash and the character it escapes.
    fn backslash(&mut self) {
        self.i += 1;
        if self.refuse_placeholder_at(self.i, "right after a backslash") {
            return;
        }
        if let Some(Token::Char(_, w)) = self.token(self.i) {
            self.i += w;
        }
    }

    /// A `$`: opens `$(`, `$((`, `${` or (outside double quotes) `$'`;
    /// refuses a placeholder right after it.
    fn dollar(&mut self, ansi_quotes: bool) {
        self.i += 1;
        if self.refuse_placeholder_at(
            self.i,
            "right after a `$`; remove the `$` (a shell variable is `${NAME}`)",
        ) {
            return;
        }
        match self.token(self.i) {
            Some(Token::Char('(', w)) => {
                self.i += w;
                if let Some(Token::Char('(', w2)) = self.token(self.i) {
                    self.i += w2;
                    self.stack.push(Frame::Arithmetic { parens: 0 });
                } else {
                    self.stack.push(Frame::Command {
                        parens: 0,
                        nested: true,
                    });
                    self.word_start = true;
                }
            }
            Some(Token::Char('{', w)) => {
                self.i += w;
                self.stack.push(Frame::Parameter { braces: 0 });
            }
            Some(Token::Char('\'', w)) if ansi_quotes => {
                self.i += w;
                self.scan_quoted(
                    '\'',
                    true,
                    Err("inside `$'…'`; use `'…'` or `\"…\"`".to_owned()),
                );
            }
            _ => {}
        }
    }

    /// Scans up to the closing `quote`, recording placeholders with
    /// `context`.
    fn scan_quoted(&mut self, quote: char, backslashes: bool, context: Result<Context, String>) {
        while let Some(token) = self.token(self.i) {
            match token {
                Token::Placeholder(p) => {
                    self.record(&p, context.clone());
                    self.i = p.range.end;
                }
                Token::Char('\\', _) if backslashes => self.backslash(),
                Token::Char(c, w) => {
                    self.i += w;
                    if c == quote {
                        return;
                    }
                }
            }
        }
    }

    fn command_char(&mut self, c: char, width: usize) {
        let at_word_start = self.word_start;
        self.word_start = false;
        match c {
            ' ' | '\t' => {
                self.i += width;
                self.word_start = true;
            }
            '\n' => {
                self.i += width;
                self.word_start = true;
                self.heredoc_bodies();
            }
            '\\' => self.backslash(),
            '\'' => {
                self.i += width;
                self.scan_quoted('\'', false, Ok(Context::SingleQuoted));
            }
            '"' => {
                self.i += width;
                self.stack.push(Frame::Double);
            }
            '`' => {
                self.i += width;
                self.stack.push(Frame::Backquote);
            }
            '$' => self.dollar(true),
            '#' if at_word_start => {
                while let Some(token) = self.token(self.i) {
                    match token {
                        Token::Char('\n', _) => break,
                        Token::Char(_, w) => self.i += w,
                        Token::Placeholder(p) => {
                            self.record(&p, Ok(Context::Comment));
                            self.i = p.range.end;
                        }
                    }
                }
            }
            '<' if self.peek(1) == Some('<') && self.peek(2) == Some('<') => {
                // `<<<WORD`: a here-string, an ordinary word.
                self.i += 3 * width;
                self.word_start = true;
            }
            '<' if self.peek(1) == Some('<') => {
                self.i += 2 * width;
                self.heredoc_operator();
            }
            '(' | ')' | ';' | '&' | '|' | '<' | '>' => {
                self.i += width;
                self.word_start = true;
                if let Some(Frame::Command { parens, nested }) = self.stack.last_mut() {
                    if c == '(' {
                        *parens += 1;
                    } else if c == ')' {
                        if *parens > 0 {
                            *parens -= 1;
                        } else if *nested {
                            self.stack.pop();
                            self.word_start = false;
                        }
                    }
                }
            }
            _ => {
                let nested = matches!(self.stack.last(), Some(Frame::Command { nested: true, .. }));
                if at_word_start
                    && nested
                    && self.text[self.i..].starts_with("case")
                    && self.text[self.i + 4..].starts_with([' ', '\t', '\n'])
                {
                    self.confused = Some(
                        "after a `case` inside `$(…)`, whose patterns cairn does not follow; move the `case` out of `$(…)`",
                    );
                }
                self.i += width;
            }
        }
    }

    fn double_char(&mut self, c: char, width: usize) {
        match c {
            '"' => {
                self.i += width;
                self.stack.pop();
            }
            '\\' => self.backslash(),
            '`' => {
                self.i += width;
                self.stack.push(Frame::Backquote);
            }
            '$' => self.dollar(false),
            _ => self.i += width,
        }
    }

    fn backquote_char(&mut self, c: char, width: usize) {
        match c {
            '\\' => self.backslash(),
            '`' => {
                self.i += width;
                self.stack.pop();
            }
            _ => self.i += width,
        }
    }

    fn parameter_char(&mut self, c: char, width: usize) {
        if c == '\\' {
            self.backslash();
            return;
        }
        self.i += width;
        if let Some(Frame::Parameter { braces }) = self.stack.last_mut() {
            match c {
                '{' => *braces += 1,
                '}' if *braces > 0 => *braces -= 1,
                '}' => {
                    self.stack.pop();
                }
                _ => {}
            }
        }
    }

    fn arithmetic_char(&mut self, c: char, width: usize) {
        if c == '$' {
            self.dollar(false);
            return;
        }
        self.i += width;
        if let Some(Frame::Arithmetic { parens }) = self.stack.last_mut() {
            match c {
                '(' => *parens += 1,
                ')' if *parens > 0 => *parens -= 1,
                ')' => {
                    if let Some(Token::Char(')', w)) = self.token(self.i) {
                        self.i += w;
                    }
                    self.stack.pop();
                }
                _ => {}
            }
        }
    }

    /// After `<<`: reads `-` and the delimiter word.
    fn heredoc_operator(&mut self) {
        let mut strip_tabs = false;
        if let Some(Token::Char('-', w)) = self.token(self.i) {
            strip_tabs = true;
            self.i += w;
        }
        while let Some(Token::Char(' ' | '\t', w)) = self.token(self.i) {
            self.i += w;
        }
        let mut delimiter = String::new();
        while let Some(token) = self.token(self.i) {
            match token {
                Token::Placeholder(p) => {
                    self.found.insert(
                        p.range.start,
                        Err("as a here-document delimiter".to_owned()),
                    );
                    self.i = p.range.end;
                }
                Token::Char(c, w) => {
                    if c.is_whitespace() || ";&|()<>".contains(c) {
                        break;
                    }
                    if !matches!(c, '\'' | '"' | '\\') {
                        delimiter.push(c);
                    }
                    self.i += w;
                }
            }
        }
        self.heredocs.push(Heredoc {
            delimiter,
            strip_tabs,
        });
    }

    /// After a newline: the bodies of pending here-documents, where every
    /// placeholder is refused (a value holding the delimiter line would end
    /// the document early).
    fn heredoc_bodies(&mut self) {
        for heredoc in std::mem::take(&mut self.heredocs) {
            loop {
                if self.i >= self.bytes.len() {
                    return;
                }
                let end = self.text[self.i..]
                    .find('\n')
                    .map_or(self.bytes.len(), |n| self.i + n);
                let line = &self.text[self.i..end];
                let candidate = if heredoc.strip_tabs {
                    line.trim_start_matches('\t')
                } else {
                    line
                };
                let closes = candidate == heredoc.delimiter;
                let mut at = self.i;
                while at < end {
                    match self.token(at) {
                        Some(Token::Placeholder(p)) => {
                            self.found.insert(
                                p.range.start,
                                Err("in a here-document; pass the value as an argument or through a file".to_owned()),
                            );
                            at = p.range.end;
                        }
                        Some(Token::Char(_, w)) => at += w,
                        None => break,
                    }
                }
                self.i = (end + 1).min(self.bytes.len());
                if closes {
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn context_of(script: &str) -> Result<Context, String> {
        let found = contexts(script);
        assert_eq!(found.len(), 1, "{script}: {found:?}");
        found.into_values().next().unwrap()
    }

    #[test]
    fn lexes_the_context_of_each_placeholder() {
        for (script, expected) in [
            ("echo {item.x}", Context::Word),
            ("echo a{item.x}b", Context::Word),
            ("echo '{item.x}'", Context::SingleQuoted),
            ("echo 'a b {item.x} c'", Context::SingleQuoted),
            ("echo \"{item.x}\"", Context::DoubleQuoted),
            ("echo \"a 'b' {item.x}\"", Context::DoubleQuoted),
            ("echo \"$(cat '{item.x}')\"", Context::SingleQuoted),
            ("echo \"$(cat {item.x})\"", Context::Word),
            ("echo $(echo \"(\") {item.x}", Context::Word),
            ("echo \"\\\"\" {item.x}", Context::Word),
            ("echo \\' {item.x}", Context::Word),
            ("echo $(( {item.x} + 1 ))", Context::Arithmetic),
            ("echo $(( ({item.x}) + 1 )) ", Context::Arithmetic),
            ("# echo {item.x}", Context::Comment),
            ("echo a#{item.x}", Context::Word),
            ("echo $# {item.x}", Context::Word),
            ("cat <<EOF\nbody\nEOF\necho {item.x}", Context::Word),
            ("cat <<<{item.x}", Context::Word),
            ("awk '{print $1}' {item.x}", Context::Word),
            ("echo {{'}} {item.x}'", Context::SingleQuoted),
            ("echo {{x}} {item.x}", Context::Word),
        ] {
            assert_eq!(context_of(script), Ok(expected), "{script}");
        }
    }

    #[test]
    fn refuses_places_where_no_quoting_is_safe() {
        for (script, why) in [
            ("echo `echo {item.x}`", "backquotes"),
            ("echo \"`echo {item.x}`\"", "backquotes"),
            ("echo ${item.x}", "`$`"),
            ("echo \"${item.x}\"", "`$`"),
            ("echo \\{item.x}", "backslash"),
            ("echo \"\\{item.x}\"", "backslash"),
            ("echo ${X:-{item.x}}", "`${"),
            ("echo $'{item.x}'", "$'"),
            ("cat <<EOF\n{item.x}\nEOF", "here-document"),
            ("cat <<-'EOF'\n\t{item.x}\n\tEOF", "here-document"),
            ("cat <<{item.x}\nx\n", "delimiter"),
            ("x=$(case a in a) echo;; esac) {item.x}", "case"),
        ] {
            let error = context_of(script).unwrap_err();
            assert!(error.contains(why), "{script}: {error}");
        }
    }

    #[test]
    fn quotes_plain_values_bare_and_everything_else_as_one_word() {
        assert_eq!(quote_word("state/a.json"), "state/a.json");
        assert_eq!(quote_word("0.25"), "0.25");
        assert_eq!(quote_word(""), "''");
        assert_eq!(quote_word("if"), "'if'");
        assert_eq!(quote_word("a b"), "'a b'");
        assert_eq!(quote_word("it's"), r"'it'\''s'");
        assert_eq!(
            quote(
                Context::Word,
                Value::List(&["python3".into(), "a b".into()])
            )
            .unwrap(),
            "python3 'a b'"
        );
        assert!(quote(Context::DoubleQuoted, Value::List(&["a".into()])).is_err());
        assert!(quote(Context::Word, Value::One("a\0b")).is_err());
        assert!(quote(Context::Arithmetic, Value::One("1+x[$(id)]")).is_err());
        assert_eq!(
            quote(Context::Arithmetic, Value::One("-12")).unwrap(),
            "-12"
        );
    }

    /// What `sh -c SCRIPT` prints.
    fn sh(script: &str) -> Vec<u8> {
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .env_clear()
            .output()
            .expect("run /bin/sh");
        assert!(out.status.success(), "{script}: {out:?}");
        out.stdout
    }

    fn hostile() -> impl Strategy<Value = String> {
        let pieces = prop::sample::select(vec![
            "'", "\"", "\\", "$", "`", "$(", ")", ";", "\n", " ", "\t", "*", "?", "[", "]", "{",
            "}", "~", "#", "&", "|", "<", ">", "!", "=", "%", "if", "a", "-", "é", "EOF", "'\\''",
        ]);
        prop::collection::vec(
            prop_oneof![pieces.prop_map(str::to_owned), any::<String>()],
            0..8,
        )
        .prop_map(|parts| parts.concat().replace('\0', ""))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// For any value, in each context, the shell receives exactly its
        /// bytes.
        #[test]
        fn the_shell_receives_exactly_the_value(value in hostile()) {
            let word = quote(Context::Word, Value::One(&value)).unwrap();
            let single = quote(Context::SingleQuoted, Value::One(&value)).unwrap();
            let double = quote(Context::DoubleQuoted, Value::One(&value)).unwrap();
            let script = format!(
                "printf '%s' {word}; printf '|'; printf '%s' '{single}'; printf '|'; printf '%s' \"{double}\""
            );
            let expected = format!("{value}|{value}|{value}");
            let printed = sh(&script);
            prop_assert_eq!(String::from_utf8_lossy(&printed), expected);
        }
    }
}
