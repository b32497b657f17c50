//! The TOML document as a tree of spanned nodes.
//!
//! `toml_edit` keeps the byte span of every key and value. We copy its tree
//! into [`Node`]s once, so that validation (`load.rs`) can walk one uniform
//! shape and point every error at the exact bytes it is about, without
//! serde stopping at the first problem.

use std::ops::Range;

use toml_edit::{Item, Table, Value};

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

/// Parses `source` into a spanned tree (the root is a table).
pub fn parse(source: &str) -> Result<Node, SyntaxError> {
    let document = toml_edit::Document::parse(source).map_err(|error| SyntaxError {
        message: error.message().trim().to_owned(),
        span: error.span().unwrap_or(0..0),
    })?;
    Ok(table_node(document.as_table(), 0..0))
}

fn table_node(table: &Table, fallback: Span) -> Node {
    let span = table.span().unwrap_or(fallback);
    let entries = table
        .iter()
        .filter_map(|(key, _)| table.get_key_value(key))
        .map(|(key, item)| {
            let key_span = key.span().unwrap_or(span.clone());
            Entry {
                key: key.get().to_owned(),
                value: item_node(item, key_span.clone()),
                key_span,
            }
        })
        .collect();
    Node {
        span,
        kind: NodeKind::Table(entries),
    }
}

fn item_node(item: &Item, fallback: Span) -> Node {
    match item {
        Item::Value(value) => value_node(value, fallback),
        Item::Table(table) => table_node(table, fallback),
        Item::ArrayOfTables(tables) => Node {
            span: tables.span().unwrap_or(fallback.clone()),
            kind: NodeKind::Array(
                tables
                    .iter()
                    .map(|table| table_node(table, fallback.clone()))
                    .collect(),
            ),
        },
        Item::None => Node {
            span: fallback,
            kind: NodeKind::Table(Vec::new()),
        },
    }
}

fn value_node(value: &Value, fallback: Span) -> Node {
    let span = value.span().unwrap_or(fallback);
    let kind = match value {
        Value::String(s) => NodeKind::String(s.value().clone()),
        Value::Integer(i) => NodeKind::Integer(*i.value()),
        Value::Float(f) => NodeKind::Float(*f.value()),
        Value::Boolean(b) => NodeKind::Boolean(*b.value()),
        Value::Datetime(d) => NodeKind::Datetime(d.value().to_string()),
        Value::Array(array) => NodeKind::Array(
            array
                .iter()
                .map(|value| value_node(value, span.clone()))
                .collect(),
        ),
        Value::InlineTable(table) => NodeKind::Table(
            table
                .iter()
                .filter_map(|(key, _)| table.get_key_value(key))
                .map(|(key, value)| {
                    let key_span = key.span().unwrap_or(span.clone());
                    Entry {
                        key: key.get().to_owned(),
                        value: item_node(value, key_span.clone()),
                        key_span,
                    }
                })
                .collect(),
        ),
    };
    Node { span, kind }
}
