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
    walk(text, false, |p| resolve(p).map(Some))
}

/// Replaces every placeholder with `resolve(placeholder)`, or keeps it as
/// written where that gives `None`; collects every placeholder that does
/// not resolve. With `keep_escapes` the result is still a template: a
/// literal brace stays `{{`/`}}`, and so does every brace of a resolved
/// value, so a later pass fills only the placeholders kept.
pub fn walk<'a, E>(
    text: &'a str,
    keep_escapes: bool,
    mut resolve: impl FnMut(&Placeholder<'a>) -> Result<Option<String>, E>,
) -> Result<String, Vec<E>> {
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if (b == b'{' || b == b'}') && bytes.get(i + 1) == Some(&b) {
            out.push(b as char);
            if keep_escapes {
                out.push(b as char);
            }
            i += 2;
            continue;
        }
        if b == b'{'
            && let Some(placeholder) = placeholder_at(text, i)
        {
            match resolve(&placeholder) {
                Ok(Some(value)) if keep_escapes => {
                    out.push_str(&value.replace('{', "{{").replace('}', "}}"))
                }
                Ok(Some(value)) => out.push_str(&value),
                Ok(None) => out.push_str(&text[placeholder.range.clone()]),
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

/// The namespaces a placeholder can name.
pub const NAMESPACES: &[&str] = &["params", "in", "out", "item", "sample"];

/// Where `text` opens a placeholder of a known namespace and never closes
/// it (`{in.x` followed by a space or the end): a typo, not shell syntax.
pub fn unclosed(text: &str) -> Vec<std::ops::Range<usize>> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if (b == b'{' || b == b'}') && bytes.get(i + 1) == Some(&b) {
            i += 2;
            continue;
        }
        if b == b'{' && placeholder_at(text, i).is_none() {
            let rest = &text[i + 1..];
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
                .unwrap_or(rest.len());
            let closed = rest[len..].starts_with('}');
            if let Some((namespace, name)) = rest[..len].split_once('.')
                && NAMESPACES.contains(&namespace)
                && !name.is_empty()
                && !closed
            {
                found.push(i..i + 1 + len);
            }
        }
        i += text[i..].chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// The placeholder starting at byte `start` of `text`, if one does.
pub(crate) fn placeholder_at(text: &str, start: usize) -> Option<Placeholder<'_>> {
    // (After a `{`, one byte, the rest starts on a character's boundary.)
    if text.as_bytes().get(start) != Some(&b'{') {
        return None;
    }
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
    fn finds_placeholders_left_open() {
        let text = "cat {in.x > {out.y} {params.n";
        let open: Vec<&str> = unclosed(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(open, ["{in.x", "{params.n"]);
        assert!(unclosed("awk '{print $1}' ${HOME} {{in.x {x.y").is_empty());
    }

    #[test]
    fn double_braces_escape() {
        assert_eq!(run("{{params.n}}").unwrap(), "{params.n}");
    }

    #[test]
    fn keeping_escapes_leaves_a_template_to_fill_once_more() {
        let once = walk("{{x}} {params.n} {item.id}", true, |p| {
            Ok::<_, ()>((p.namespace == "params").then(|| "{item.id}".to_owned()))
        })
        .unwrap();
        assert_eq!(once, "{{x}} {{item.id}} {item.id}");
        let twice = walk(&once, false, |p| {
            Ok::<_, ()>((p.namespace == "item").then(|| "ID".to_owned()))
        })
        .unwrap();
        assert_eq!(twice, "{x} {item.id} ID");
    }

    #[test]
    fn reports_every_unresolved_placeholder() {
        assert_eq!(
            run("{in.a} {params.n} {out.b}").unwrap_err(),
            vec!["in.a", "out.b"]
        );
    }
}
