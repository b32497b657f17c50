//! How the model's fields serde cannot take as they are travel (in a kept
//! manifest, see [`super::kept`]): JSON values and regular expressions as
//! their text.

/// A JSON value as its text.
pub(super) mod json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &serde_json::Value, to: S) -> Result<S::Ok, S::Error> {
        to.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(from: D) -> Result<serde_json::Value, D::Error> {
        let text = <&str>::deserialize(from)?;
        serde_json::from_str(text).map_err(serde::de::Error::custom)
    }
}

/// Named JSON values, each as its text.
pub(super) mod json_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        values: &BTreeMap<String, serde_json::Value>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        let texts: BTreeMap<&str, String> = values
            .iter()
            .map(|(name, value)| (name.as_str(), value.to_string()))
            .collect();
        texts.serialize(to)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<BTreeMap<String, serde_json::Value>, D::Error> {
        BTreeMap::<String, String>::deserialize(from)?
            .into_iter()
            .map(|(name, text)| {
                serde_json::from_str(&text)
                    .map(|value| (name, value))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

/// A regular expression as its pattern, compiled again when read.
pub(super) mod regex {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        regex: &Option<::regex::Regex>,
        to: S,
    ) -> Result<S::Ok, S::Error> {
        regex.as_ref().map(::regex::Regex::as_str).serialize(to)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        from: D,
    ) -> Result<Option<::regex::Regex>, D::Error> {
        Option::<String>::deserialize(from)?
            .map(|pattern| ::regex::Regex::new(&pattern).map_err(serde::de::Error::custom))
            .transpose()
    }
}
