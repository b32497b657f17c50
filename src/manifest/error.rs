//! Located manifest errors, rendered with a caret excerpt of the TOML.

use std::fmt;
use std::path::PathBuf;

use miette::{Diagnostic, GraphicalReportHandler, GraphicalTheme, NamedSource, SourceSpan};

use super::raw::Span;

/// One problem in a manifest: what is wrong, where, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub message: String,
    pub span: Span,
    pub label: String,
    pub help: Option<String>,
}

impl Problem {
    pub fn new(message: impl Into<String>, span: Span, label: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            span,
            label: label.into(),
            help: None,
        }
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// Every problem found in one manifest.
#[derive(Debug, thiserror::Error)]
pub struct ManifestErrors {
    pub path: PathBuf,
    pub source_text: String,
    pub problems: Vec<Problem>,
}

/// Reading or validating a manifest failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("failed to read manifest `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unknown profile `{name}`{}", known_list(known))]
    UnknownProfile { name: String, known: Vec<String> },
    #[error(transparent)]
    Invalid(#[from] ManifestErrors),
}

fn known_list(known: &[String]) -> String {
    if known.is_empty() {
        " (the manifest defines no profiles)".to_owned()
    } else {
        format!(" (defined: {})", known.join(", "))
    }
}

#[derive(Debug, thiserror::Error, Diagnostic)]
#[error("{message}")]
struct Rendered {
    message: String,
    #[source_code]
    source_code: NamedSource<String>,
    #[label("{label}")]
    span: SourceSpan,
    label: String,
    #[help]
    help: Option<String>,
}

impl ManifestErrors {
    /// `file:line:col` of a problem (1-based), for one-line summaries.
    pub fn location(&self, problem: &Problem) -> String {
        let (line, col) = line_col(&self.source_text, problem.span.start);
        format!("{}:{line}:{col}", self.path.display())
    }

    /// Renders every problem with an excerpt of the manifest.
    pub fn render(&self, color: bool) -> String {
        let theme = if color {
            GraphicalTheme::unicode()
        } else {
            GraphicalTheme::unicode_nocolor()
        };
        let handler = GraphicalReportHandler::new_themed(theme);
        let mut out = String::new();
        for problem in &self.problems {
            out.push_str(&format!(
                "error: {}: {}\n",
                self.location(problem),
                problem.message
            ));
            let rendered = Rendered {
                message: problem.message.clone(),
                source_code: NamedSource::new(
                    self.path.display().to_string(),
                    self.source_text.clone(),
                ),
                span: clamp(&problem.span, self.source_text.len()).into(),
                label: problem.label.clone(),
                help: problem.help.clone(),
            };
            let mut excerpt = String::new();
            if handler.render_report(&mut excerpt, &rendered).is_ok() {
                // The first line repeats the message; the excerpt follows.
                let body = excerpt.split_once('\n').map_or("", |(_, rest)| rest);
                out.push_str(body.trim_end());
                out.push('\n');
            }
            out.push('\n');
        }
        let n = self.problems.len();
        out.push_str(&format!(
            "{n} problem{} in {}; nothing was run\n",
            if n == 1 { "" } else { "s" },
            self.path.display()
        ));
        out
    }
}

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} problem(s) in manifest `{}`",
            self.problems.len(),
            self.path.display()
        )
    }
}

fn clamp(span: &Span, len: usize) -> std::ops::Range<usize> {
    let start = span.start.min(len);
    let end = span.end.clamp(start, len);
    start..end
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(source.len());
    let before = &source[..floor_char_boundary(source, offset)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}
