//! Misspelled routing annotations: every `warmpath.dev/*` key on an HTTPRoute that is not one the
//! controller reads is reported (an Event and the route's warmpath status), with the known key it
//! most resembles, instead of being ignored without a word (`routing-stratgy` would otherwise
//! leave routing silently off).

use std::collections::BTreeMap;

use crate::routing::{
    ANNOTATION_CONCURRENCY_THRESHOLD, ANNOTATION_DEBUG_HEADER, ANNOTATION_PREFIX_LENGTH, ANNOTATION_STRATEGY,
};

/// Prefix of warmpath's annotation keys.
pub const PREFIX: &str = "warmpath.dev/";

/// The annotation keys the route reconciler reads.
pub const KNOWN: [&str; 4] =
    [ANNOTATION_STRATEGY, ANNOTATION_PREFIX_LENGTH, ANNOTATION_CONCURRENCY_THRESHOLD, ANNOTATION_DEBUG_HEADER];

/// Unknown `warmpath.dev/*` keys with the nearest known key (normalized Damerau-Levenshtein
/// similarity of the part after the prefix at least 0.6; `None` when nothing is close), sorted by key.
pub fn unknown(annotations: &BTreeMap<String, String>) -> Vec<(String, Option<&'static str>)> {
    annotations
        .keys()
        .filter(|k| k.starts_with(PREFIX) && !KNOWN.contains(&k.as_str()))
        .map(|k| {
            let nearest = KNOWN
                .iter()
                // Without the shared prefix, which would make every key look alike.
                .map(|known| {
                    (strsim::normalized_damerau_levenshtein(&k[PREFIX.len()..], &known[PREFIX.len()..]), *known)
                })
                .filter(|(score, _)| *score >= 0.6)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, known)| known);
            (k.clone(), nearest)
        })
        .collect()
}

/// One line per unknown key: "unknown annotation K (did you mean N?)", or `None` when all are known.
pub fn message(annotations: &BTreeMap<String, String>) -> Option<String> {
    let found = unknown(annotations);
    (!found.is_empty()).then(|| {
        found
            .iter()
            .map(|(k, near)| match near {
                Some(n) => format!("unknown annotation {k} ignored (did you mean {n}?)"),
                None => format!("unknown annotation {k} ignored (known: {})", KNOWN.join(", ")),
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(keys: &[&str]) -> BTreeMap<String, String> {
        keys.iter().map(|k| (k.to_string(), "x".to_string())).collect()
    }

    #[test]
    fn misspelled_keys_are_named_with_the_nearest_known_key() {
        let got = unknown(&ann(&[
            "warmpath.dev/routing-stratgy",
            "warmpath.dev/prefix-lenght",
            "warmpath.dev/concurency-threshold",
        ]));
        assert_eq!(
            got,
            vec![
                ("warmpath.dev/concurency-threshold".to_string(), Some(ANNOTATION_CONCURRENCY_THRESHOLD)),
                ("warmpath.dev/prefix-lenght".to_string(), Some(ANNOTATION_PREFIX_LENGTH)),
                ("warmpath.dev/routing-stratgy".to_string(), Some(ANNOTATION_STRATEGY)),
            ]
        );
    }

    #[test]
    fn known_and_foreign_keys_are_not_reported_and_far_keys_get_no_guess() {
        assert!(unknown(&ann(&[
            ANNOTATION_STRATEGY,
            ANNOTATION_PREFIX_LENGTH,
            "example.com/routing-stratgy",
            "kubectl.kubernetes.io/last-applied-configuration"
        ]))
        .is_empty());
        assert_eq!(message(&ann(&[ANNOTATION_STRATEGY])), None);
        let m = message(&ann(&["warmpath.dev/tenant"])).unwrap();
        assert!(
            m.contains("unknown annotation warmpath.dev/tenant ignored (known: warmpath.dev/routing-strategy"),
            "{m}"
        );
    }
}
