//! The TOML document as a tree of spanned nodes.
//!
//! The `toml` crate's `DeTable` keeps the byte span of every key and value.
//! We copy its tree into [`Node`]s once, so that validation (`load.rs`) can walk one uniform
//! shape and point every error at the exact bytes it is about, without
//! serde stopping at the first problem.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

/// A byte range in the manifest source.
pub type Span = Range<usize>;

/// A value with the span it came from.
#[derive(Debug, Clone)]
pub struct Node {
    pub span: Span,
    pub kind: NodeKind,
}

#[derive(Debug, Clone)]
pub enum NodeKind {
    String(String),
    Integer(i64),
    Float(f64),
    Boolean(bool),
    Datetime(String),
    Array(Vec<Node>),
    Table(Vec<Entry>),
}

/// One `key = value` of a table, in document order.
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    pub key_span: Span,
    pub value: Node,
}

impl Node {
    /// The TOML type name, for "expected X, found Y" messages.
    pub fn type_name(&self) -> &'static str {
        match self.kind {
            NodeKind::String(_) => "a string",
            NodeKind::Integer(_) => "an integer",
            NodeKind::Float(_) => "a float",
            NodeKind::Boolean(_) => "a boolean",
            NodeKind::Datetime(_) => "a datetime",
            NodeKind::Array(_) => "an array",
            NodeKind::Table(_) => "a table",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_table(&self) -> Option<&[Entry]> {
        match &self.kind {
            NodeKind::Table(entries) => Some(entries),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// A syntax error from the TOML parser.
#[derive(Debug)]
pub struct SyntaxError {
    pub message: String,
    pub span: Span,
}

/// Parses `source` into a spanned tree (the root is a table). Tables keep
/// document order, which is what stage listings follow.
pub fn parse(source: &str) -> Result<Node, SyntaxError> {
    let document = DeTable::parse(source).map_err(|error| SyntaxError {
        message: error.message().trim().to_owned(),
        span: error.span().unwrap_or(0..0),
    })?;
    let span = document.span();
    Ok(Node {
        span,
        kind: NodeKind::Table(table_entries(document.get_ref())),
    })
}

fn table_entries(table: &DeTable<'_>) -> Vec<Entry> {
    let mut entries: Vec<Entry> = table
        .iter()
        .map(|(key, value)| Entry {
            key: key.get_ref().to_string(),
            key_span: key.span(),
            value: node(value),
        })
        .collect();
    entries.sort_by_key(|e| e.key_span.start);
    entries
}

fn node(value: &Spanned<DeValue<'_>>) -> Node {
    let span = value.span();
    let kind = match value.get_ref() {
        DeValue::String(s) => NodeKind::String(s.to_string()),
        DeValue::Integer(i) => match i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
            Ok(n) => NodeKind::Integer(n),
            Err(_) => NodeKind::String(i.as_str().to_owned()),
        },
        DeValue::Float(f) => NodeKind::Float(float(f.as_str())),
        DeValue::Boolean(b) => NodeKind::Boolean(*b),
        DeValue::Datetime(d) => NodeKind::Datetime(d.to_string()),
        DeValue::Array(items) => NodeKind::Array(items.iter().map(node).collect()),
        DeValue::Table(table) => NodeKind::Table(table_entries(table)),
    };
    Node { span, kind }
}

fn float(text: &str) -> f64 {
    let clean = text.replace('_', "");
    match clean.trim_start_matches(['+', '-']) {
        "inf" if clean.starts_with('-') => f64::NEG_INFINITY,
        "inf" => f64::INFINITY,
        "nan" => f64::NAN,
        _ => clean.parse().unwrap_or(f64::NAN),
    }
}
