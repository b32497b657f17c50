//! The items rooms' unit tests.

use super::fill::*;
use super::list::*;
use super::*;
use crate::fingerprint::canonical_json;

#[test]
fn fills_nested_fields_and_leaves_other_braces() {
    let value = serde_json::json!({"id": "t1", "repo": {"name": "r"}, "n": 3});
    let item = Item {
        key: "t1".into(),
        canonical: canonical_json(&value).into(),
        sample: None,
    };
    assert_eq!(
        fill("run {item.id} {item.repo.name} {item.n} ${HOME}", &item).unwrap(),
        "run t1 r 3 ${HOME}"
    );
    assert!(
        fill("{item.missing}", &item)
            .unwrap_err()
            .contains("missing")
    );
}

#[test]
fn aggregate_bytes_do_not_depend_on_order() {
    let planned = |key: &str| PlannedItem {
        item: Item {
            key: key.into(),
            canonical: canonical_json(&serde_json::json!({"id": key, "n": [1.5, "é\n"]})).into(),
            sample: None,
        },
        fingerprint: Digest::of(key.as_bytes()),
        image: None,
        attempts_before: 1,
        code: Arc::new(Digest::of(b"code")),
        outcome: Some((ItemClass::Ok, 1)),
        result: None,
        outputs: None,
        inputs: Box::default(),
    };
    let a = aggregate(&[planned("b"), planned("a"), planned("c")]);
    let b = aggregate(&[planned("c"), planned("b"), planned("a")]);
    assert_eq!(a, b);
}

/// Planned items are found by fingerprint through its first eight
/// bytes, also when another item shares those; of two with one
/// fingerprint, the later (as a map keyed by whole digests found).
#[test]
fn the_plan_index_finds_items_whose_first_bytes_are_shared() {
    let planned = |key: &str, fingerprint: Digest| PlannedItem {
        fingerprint,
        ..unplanned(key)
    };
    let with_first = |first: u8, last: u8| {
        let mut bytes = [first; 32];
        bytes[31] = last;
        Digest::from_bytes(bytes)
    };
    let plan = vec![
        planned("a", with_first(1, 1)),
        planned("b", with_first(1, 2)),
        planned("c", with_first(1, 3)),
        planned("d", with_first(2, 1)),
        planned("d again", with_first(2, 1)),
    ];
    let index = PlanIndex::of(&plan);
    let found = |digest: Digest| {
        index
            .find(&plan, &digest)
            .map(|n| plan[n].item.key.as_str())
    };
    assert_eq!(found(with_first(1, 1)), Some("a"));
    assert_eq!(found(with_first(1, 2)), Some("b"));
    assert_eq!(found(with_first(1, 3)), Some("c"));
    assert_eq!(found(with_first(2, 1)), Some("d again"));
    assert_eq!(found(with_first(1, 4)), None);
    assert_eq!(found(with_first(3, 1)), None);
}

/// Keys whose hashes collide are told apart by the keys themselves:
/// with every key hashed alike, distinct keys pass and a shared one is
/// still caught, named with both items' positions.
#[test]
fn colliding_key_hashes_are_compared_for_real() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("items.jsonl");
    std::fs::write(&path, "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": 7}\n").unwrap();
    let mut keys = Vec::new();
    read_items(
        &path,
        "id",
        |_| 0,
        |_, key, _| {
            keys.push(key);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(keys, ["a", "b", "7"]);
    std::fs::write(
        &path,
        "{\"id\": \"a\"}\n{\"id\": \"b\"}\n{\"id\": \"c\"}\n{\"id\": \"b\"}\n",
    )
    .unwrap();
    for hash in [|_: &str| 0, key_hash] {
        let error = read_items(&path, "id", hash, |_, _, _| Ok(())).unwrap_err();
        assert!(
            error.contains("items 2 and 4") && error.contains("share the key `b`"),
            "{error}"
        );
    }
    std::fs::write(&path, "{\"id\": \"a\"}\n{\"id\": \"a\"}\n").unwrap();
    let error = read_items(&path, "id", |_| 0, |_, _, _| Ok(())).unwrap_err();
    assert!(error.contains("items 1 and 2"), "{error}");
}

/// Planning fills templates from the value as read, a command from the
/// canonical text read again: the two must be the same value.
#[test]
fn an_items_canonical_text_reads_back_as_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("list.jsonl");
    std::fs::write(
        &path,
        "{\"id\": \"a\", \"x\": 118.075470945216424, \"y\": 1e-7, \"z\": 0.30000000000000004}\n",
    )
    .unwrap();
    let mut read = Vec::new();
    for_each_item(&path, "id", |item, value| {
        read.push((item, value.clone()));
        Ok(())
    })
    .unwrap();
    let (item, value) = &read[0];
    assert_eq!(&item.value(), value, "{}", item.canonical);
    assert_eq!(fill("{item.x}", item).unwrap(), value["x"].to_string());
}

/// A million planned items are held at once: what each takes is
/// watched.
#[test]
fn a_planned_item_stays_small() {
    assert!(
        std::mem::size_of::<PlannedItem>() <= 184,
        "{}",
        std::mem::size_of::<PlannedItem>()
    );
}

/// An item keyed `key`, planned with no outcome yet.
fn unplanned(key: &str) -> PlannedItem {
    PlannedItem {
        item: Item {
            key: key.to_owned(),
            canonical: Arc::from("{}"),
            sample: None,
        },
        fingerprint: Digest::of(key.as_bytes()),
        image: None,
        attempts_before: 0,
        code: Arc::new(Digest::of(b"code")),
        outcome: None,
        result: None,
        outputs: None,
        inputs: Box::default(),
    }
}

/// Runs of more than a few keys alike to their end (keys are unique in
/// a list; the sort must end all the same) and keys ending exactly
/// where a word of eight bytes does.
#[test]
fn keys_alike_to_their_end_or_ending_on_a_word_are_put_in_order() {
    let mut keys: Vec<String> = vec!["the-same-key-0123".to_owned(); 20];
    keys.extend(
        [
            "abcdefgh",
            "abcdefg",
            "abcdefghi",
            "abcdefgh12345678",
            "abcdefgh1234567",
        ]
        .map(String::from),
    );
    keys.extend((0..20).map(|n| format!("abcdefgh{:08}", 99 - n)));
    let planned: Vec<PlannedItem> = keys.iter().map(|key| unplanned(key)).collect();
    let ordered: Vec<&str> = in_key_order(&planned)
        .map(|p| p.item.key.as_str())
        .collect();
    keys.sort();
    assert_eq!(ordered, keys);
}

proptest::proptest! {
    /// Keys put in order eight bytes at a time are in the order of the
    /// keys whole: sharing prefixes of every length, ending within
    /// eight bytes or after them, with a few keys unlike the rest.
    #[test]
    fn items_in_key_order_are_in_the_order_of_their_keys(
        prefix in "[a-c]{0,20}",
        rests in proptest::collection::hash_set("[a-c.é]{0,30}", 0..80),
        outliers in proptest::collection::hash_set("[a-z]{1,3}", 0..3),
    ) {
        // (In no order: a set's.)
        let keys: std::collections::HashSet<String> = rests
            .iter()
            .map(|rest| format!("{prefix}{rest}"))
            .chain(outliers)
            .collect();
        let planned: Vec<PlannedItem> = keys
            .iter()
            .map(|key| unplanned(key))
            .collect();
        let mut expected: Vec<&str> = planned.iter().map(|p| p.item.key.as_str()).collect();
        expected.sort();
        let ordered: Vec<&str> = in_key_order(&planned).map(|p| p.item.key.as_str()).collect();
        proptest::prop_assert_eq!(ordered, expected);
    }
}

/// Each merged line is exactly the canonical JSON of its record, as
/// when it was built as a value and canonicalised.
#[test]
fn aggregate_lines_are_canonical_json() {
    let value = serde_json::json!({"id": "a\"b", "deep": {"z": 1, "a": [null, 2.5]}});
    let result = serde_json::json!({"score": 0.5, "notes": "é\u{1}"});
    let planned = PlannedItem {
        item: Item {
            key: "a\"b".into(),
            canonical: canonical_json(&value).into(),
            sample: None,
        },
        fingerprint: Digest::of(b"a"),
        image: None,
        attempts_before: 1,
        code: Arc::new(Digest::of(b"code")),
        outcome: Some((ItemClass::Verdict("fail".into()), 1)),
        result: Some(Box::new(result.clone())),
        outputs: None,
        inputs: Box::default(),
    };
    let expected = canonical_json(&serde_json::json!({
        "key": "a\"b", "class": "fail", "item": value, "result": result,
    })) + "\n";
    assert_eq!(String::from_utf8(aggregate(&[planned])).unwrap(), expected);
}
