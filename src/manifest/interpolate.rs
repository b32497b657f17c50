//! `{namespace.name}` placeholders in commands.
//!
//! A placeholder is `{` + a dotted name (`params.size`, `in.meta`,
//! `out.plan`) + `}`. Anything else in braces is left alone, so shell
//! syntax such as `${HOME}` or `awk '{print $1}'` passes through untouched;
//! `{{` and `}}` write a literal brace where a placeholder would otherwise be
//! read.

/// A placeholder found in a string: its dotted name and byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `{…}` including the braces, relative to the string.
    pub range: std::ops::Range<usize>,
}

/// Replaces every placeholder with `resolve(placeholder)`; collects every
/// placeholder that does not resolve.
pub fn interpolate<'a, E>(
    text: &'a str,
    mut resolve: impl FnMut(&Placeholder<'a>) -> Result<String, E>,
) -> Result<String, Vec<E>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if (b == b'{' || b == b'}') && bytes.get(i + 1) == Some(&b) {
            out.push(b as char);
            i += 2;
            continue;
        }
        if b == b'{'
            && let Some(placeholder) = placeholder_at(text, i)
        {
            match resolve(&placeholder) {
                Ok(value) => out.push_str(&value),
                Err(error) => errors.push(error),
            }
            i = placeholder.range.end;
            continue;
        }
        let ch = text[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn placeholder_at(text: &str, start: usize) -> Option<Placeholder<'_>> {
    let rest = &text[start + 1..];
    let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))?;
    if rest.as_bytes()[end] != b'}' {
        return None;
    }
    let inner = &rest[..end];
    let (namespace, name) = inner.split_once('.')?;
    let starts_like_name = namespace
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_like_name || name.is_empty() {
        return None;
    }
    Some(Placeholder {
        namespace,
        name,
        range: start..start + end + 2,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<String, Vec<String>> {
        interpolate(text, |p| match (p.namespace, p.name) {
            ("params", "n") => Ok("7".to_owned()),
            _ => Err(format!("{}.{}", p.namespace, p.name)),
        })
    }

    #[test]
    fn replaces_placeholders_and_keeps_shell_braces() {
        assert_eq!(
            run("seq {params.n} | awk '{print $1}' ${HOME}").unwrap(),
            "seq 7 | awk '{print $1}' ${HOME}"
        );
    }

    #[test]
    fn double_braces_escape() {
        assert_eq!(run("{{params.n}}").unwrap(), "{params.n}");
    }

    #[test]
    fn reports_every_unresolved_placeholder() {
        assert_eq!(
            run("{in.a} {params.n} {out.b}").unwrap_err(),
            vec!["in.a", "out.b"]
        );
    }
}
