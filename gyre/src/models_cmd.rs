//! `gyre models`: the models a running server serves, as a table or JSON.

use clap::Args;
use serde_json::Value;

use crate::client::{Server, ServerArgs};

#[derive(Args, Debug)]
pub struct ModelsArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print the catalogue as JSON (an array of the OpenAI API's model
    /// objects with gyre's fields) instead of a table.
    #[arg(long, help_heading = "Output")]
    pub json: bool,
}

pub async fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let mut server = Server::connect(&args.server).await?;
    let models = server.list_models().await?;
    let text = if args.json {
        serde_json::to_string_pretty(&models)?
    } else {
        table(&models)
    };
    crate::announce(text);
    Ok(())
}

const COLUMNS: [&str; 7] = [
    "ID", "OWNED BY", "CONTEXT", "KIND", "CHAT", "ALIASES", "VERSION",
];

/// One row per model, columns padded to their widest cell; deprecation and
/// sunset dates, when set, in an eighth column.
fn table(models: &[Value]) -> String {
    let text = |m: &Value, key: &str| match m.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => if *b { "yes" } else { "no" }.to_owned(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map_or_else(|| i.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    };
    let mut rows: Vec<Vec<String>> = vec![COLUMNS.iter().map(|c| (*c).to_owned()).collect()];
    let mut notes = false;
    for m in models {
        let mut row: Vec<String> = [
            "id",
            "owned_by",
            "max_model_len",
            "kind",
            "chat",
            "aliases",
            "version",
        ]
        .iter()
        .map(|k| text(m, k))
        .collect();
        let note = [("deprecation", "deprecated"), ("sunset", "sunset")]
            .iter()
            .filter_map(|(key, word)| {
                m.get(*key)
                    .and_then(Value::as_i64)
                    .map(|t| format!("{word} {}", date(t)))
            })
            .collect::<Vec<_>>()
            .join(", ");
        notes |= !note.is_empty();
        row.push(note);
        rows.push(row);
    }
    if notes {
        rows[0].push("NOTES".to_owned());
    } else {
        for row in &mut rows {
            row.truncate(COLUMNS.len());
        }
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Unix seconds as a UTC date, YYYY-MM-DD.
fn date(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    // Days since 1970-01-01 to a proleptic Gregorian date: shift to an era
    // starting in March 0000 so that leap days end each 4/100/400 cycle.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dates() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(951_782_400), "2000-02-29");
        assert_eq!(date(1_798_675_200), "2026-12-31");
        assert_eq!(date(-86_400), "1969-12-31");
    }

    #[test]
    fn tables_align_and_show_notes_only_when_set() {
        let models = [
            json!({"id": "chat", "owned_by": "gyre", "max_model_len": 2048, "kind": "generate",
                   "chat": true, "aliases": ["a", "b"], "version": ""}),
            json!({"id": "e", "owned_by": "me", "max_model_len": 512, "kind": "embed",
                   "chat": false, "aliases": [], "version": "v1"}),
        ];
        let t = table(&models);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "ID    OWNED BY  CONTEXT  KIND      CHAT  ALIASES  VERSION"
        );
        assert_eq!(lines[1], "chat  gyre      2048     generate  yes   a,b");
        assert_eq!(
            lines[2],
            "e     me        512      embed     no             v1"
        );
        let mut old = models[1].clone();
        old["sunset"] = json!(1_798_675_200);
        let t = table(&[models[0].clone(), old]);
        assert!(
            t.lines().next().is_some_and(|l| l.ends_with("NOTES")),
            "{t}"
        );
        assert!(t.contains("sunset 2026-12-31"), "{t}");
    }
}
