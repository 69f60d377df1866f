//! Hostile input over every route and every parameter of the console,
//! against a real console and a real database: no request may abort the
//! process, hang, or get a 5xx answer, and the console still serves after.
//! A seeded generator, so a failure is repeatable (the seed is in the
//! message); `PGWAKE_FUZZ_SEED` picks another.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::*;
use crate::support::*;

/// What a route takes: method, path (`{id}` replaced by a value), and the
/// names of its query or form fields.
const ROUTES: &[(&str, &str, &[&str])] = &[
    ("GET", "/", &[]),
    ("GET", "/fragment/overview", &[]),
    ("GET", "/workers", &["page"]),
    (
        "GET",
        "/jobs",
        &[
            "queue",
            "task",
            "state",
            "ordering_key",
            "unique_key",
            "id",
            "payload",
            "since",
            "after",
        ],
    ),
    ("GET", "/jobs/{id}", &["did", "n"]),
    ("GET", "/jobs/{id}/errors", &["page"]),
    ("GET", "/queues", &["did", "n", "page"]),
    ("GET", "/schedules", &["page"]),
    ("GET", "/login", &["next"]),
    ("GET", "/assets/console.css", &[]),
    ("GET", "/assets/console.js", &[]),
    ("GET", "/{id}", &[]),
    ("POST", "/login", &["token", "next"]),
    ("POST", "/logout", &["csrf"]),
    ("POST", "/actions/job", &["csrf", "id", "op"]),
    (
        "POST",
        "/actions/queue",
        &["csrf", "queue", "op", "max_running", "rate"],
    ),
    ("POST", "/actions/schedule", &["csrf", "name", "op"]),
    (
        "POST",
        "/bulk/review",
        &[
            "csrf",
            "action",
            "queue",
            "task",
            "state",
            "ordering_key",
            "unique_key",
            "id",
            "payload",
            "since",
        ],
    ),
    (
        "POST",
        "/bulk/apply",
        &[
            "csrf",
            "action",
            "queue",
            "task",
            "state",
            "ordering_key",
            "unique_key",
            "id",
            "payload",
            "since",
        ],
    ),
];

/// Values already percent-encoded as they go on the wire (so that invalid
/// UTF-8 and lone `%` can be sent).
fn hostile(rng: &mut StdRng, known: &[String]) -> String {
    let kind = rng.random_range(0..KINDS + 10);
    hostile_of(kind, rng, known)
}

/// How many kinds of value [`hostile_of`] makes (then a known good one).
const KINDS: usize = 21;

/// A value of one kind.
fn hostile_of(kind: usize, rng: &mut StdRng, known: &[String]) -> String {
    let long = |s: &str, n: usize| encode(&s.repeat(n));
    match kind {
        0 => long("a.", 16_000) + "a%3D1",
        1 => long("a.", rng.random_range(1..200)) + "a%3D1",
        2 => long("x", rng.random_range(1..200_000)),
        3 => long("[", rng.random_range(100..20_000)),
        4 => "a%3D".to_string() + &long("{\"a\":", rng.random_range(100..5_000)),
        5 => "a%3D".to_string() + &long("[", rng.random_range(100..5_000)),
        6 => ["%00", "a%00b", "%00%00"].choose(rng).unwrap().to_string(),
        7 => format!("x%{:02X}y", rng.random_range(1u8..32)),
        8 => ["%7F", "%0D%0ASet-Cookie:%20x=1", "%1B%5B31mred"]
            .choose(rng)
            .unwrap()
            .to_string(),
        9 => ["%FF%FE", "%C3", "%", "%zz", "%E2%82", "a%F0%9F"]
            .choose(rng)
            .unwrap()
            .to_string(),
        10 => [
            "99999999999999999999999999",
            "-9223372036854775809",
            "9223372036854775807",
            "-9223372036854775808",
            "2147483648",
            "-2147483649",
            "-1",
            "0",
            "1e309",
            "NaN",
            "-0",
            "0x10",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        11 => [
            "%2B275760-09-13T00:00:00Z",
            "9999-12-31%2023:59",
            "0000-01-01%2000:00",
            "-4713-01-01",
            "2026-02-30%2014:00",
            "2026-11-25T14:00:00%2B99:00",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        12 => [
            "dead",
            "waiting",
            "scheduled",
            "running",
            "cancelled",
            "finished",
            "bogus",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        13 => [
            "retry", "cancel", "delete", "pause", "resume", "limits", "run_now", "disable",
            "enable", "explode",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        14 => [
            "20%2Fs",
            "0%2Fs",
            "-1%2Fmin",
            "99999999999%2Fs",
            "1%2F0s",
            "1%2F99999999h",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        15 => [
            "%2F%09%2Fevil.example",
            "%2F%2Fevil.example",
            "https%3A%2F%2Fevil.example",
            "%2F%5Cevil",
            "%2Fjobs",
        ]
        .choose(rng)
        .unwrap()
        .to_string(),
        16 => encode(&format!(
            "{}={}",
            ["customer", "order.id", "a.b.c"].choose(rng).unwrap(),
            ["42", "\"x\"", "null", "[1,2]", "{\"a\":1}", "1e999999"]
                .choose(rng)
                .unwrap()
        )),
        17 => encode("<script>window.pwned=1</script>\"'"),
        18 => encode("ünïcødé ✓ \u{202E}"),
        19 => ["", "+", "%20", "%20%20%20"]
            .choose(rng)
            .unwrap()
            .to_string(),
        20 => encode(&"é".repeat(rng.random_range(500..3000))),
        _ => known.choose(rng).unwrap().clone(),
    }
}

/// A valid value of `field` of `path` (percent-encoded), `id` a job's.
fn good(path: &str, field: &str, id: &str) -> String {
    match (path, field) {
        ("/actions/job", "op") => return "cancel".into(),
        ("/actions/schedule", "op") => return "run_now".into(),
        _ => {}
    }
    match field {
        "queue" => "mail",
        "task" => "mail_send",
        "state" => "waiting",
        "ordering_key" => "k",
        "unique_key" => "u",
        "id" => id,
        "payload" => "customer%3D42",
        "since" => "2026-01-01%2014:00",
        "after" => "0",
        "did" => "retried",
        "n" => "1",
        "page" => "1",
        "next" => "%2Fjobs",
        "token" => TOKEN,
        "op" => "limits",
        "max_running" => "3",
        "rate" => "20%2Fs",
        "name" => "nightly",
        "action" => "cancel",
        _ => "x",
    }
    .to_string()
}

/// One request's outcome: the status (0 when the connection was reset
/// before an answer) and the content type.
struct Answer {
    status: u16,
    content_type: String,
}

/// Send raw bytes; a reset is `Ok` with status 0 (the console may refuse
/// an oversized request before reading it), a silence of 30 s a failure.
async fn send(addr: SocketAddr, request: Vec<u8>, what: &str) -> Answer {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let _ = s.write_all(&request).await;
        let mut raw = Vec::new();
        let _ = s.read_to_end(&mut raw).await;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .unwrap_or_else(|_| panic!("no answer within 30 s: {what}"))
        .unwrap_or_else(|e| panic!("cannot connect ({e}): the console is gone after {what}"));
    let head = String::from_utf8_lossy(&raw[..raw.len().min(4096)]).into_owned();
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Answer {
        status,
        content_type,
    }
}

#[tokio::test]
async fn no_input_aborts_hangs_or_fails_the_console() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.enqueue('mail_send', '{\"customer\": 42, \"order\": {\"id\": \"a-1\"}}',
                               queue => 'mail', ordering_key => 'k', unique_key => 'u');
         SELECT pgwake.enqueue('report', '{}', queue => 'reports', run_at => now() + interval '1 hour');
         SELECT pgwake.set_queue_max_running('mail', 3);",
    )
    .await
    .unwrap();
    pgwake::admin::schedules::add(
        &c,
        &pgwake::admin::schedules::NewSchedule::new("nightly", "0 3 * * *", "report"),
    )
    .await
    .unwrap();
    let ids: Vec<String> = c
        .query("SELECT id::text FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.expect("login");
    let mut known: Vec<String> = ids.clone();
    known.extend(
        [
            "mail",
            "reports",
            "nightly",
            "report",
            "mail_send",
            "k",
            "u",
        ]
        .map(String::from),
    );
    known.push(csrf.clone());

    let seed: u64 = std::env::var("PGWAKE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261127);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut requests = Vec::new();
    let mut request = |method: &str,
                       path: &str,
                       target: String,
                       fields: String,
                       with_cookie: bool,
                       extra: &str| {
        let mut target = target;
        let mut head = String::new();
        let body = if method == "GET" {
            if !fields.is_empty() {
                target = format!("{target}?{fields}");
            }
            Vec::new()
        } else {
            head.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
            fields.into_bytes()
        };
        if with_cookie {
            head.push_str(&format!("Cookie: {cookie}\r\n"));
        }
        head.push_str(extra);
        let request = format!(
            "{method} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n{head}\r\n",
            console.addr,
            body.len()
        );
        let mut bytes = request.into_bytes();
        bytes.extend(body);
        let shown: String = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into();
        requests.push((bytes, format!("seed {seed}, {method} {path}: {shown}…")));
    };
    // Every route with every field right (the baseline the hostile
    // values below change one at a time).
    for (method, path, fields) in ROUTES.iter().filter(|r| r.1 != "/logout") {
        let all: Vec<String> = fields
            .iter()
            .map(|f| match *f {
                "csrf" => format!("csrf={csrf}"),
                f => format!("{f}={}", good(path, f, &ids[0])),
            })
            .collect();
        request(
            method,
            path,
            path.replace("{id}", &ids[0]),
            all.join("&"),
            true,
            "",
        );
    }
    // Every kind of value in every field alone (the others absent, the
    // session and its CSRF token right), and in the path.
    for (method, path, fields) in ROUTES {
        for kind in 0..KINDS {
            if *path == "/login" && *method == "POST" && kind % 4 != 0 {
                continue; // a wrong credential waits: a few suffice
            }
            let csrf_field = if fields.contains(&"csrf") {
                format!("csrf={csrf}&")
            } else {
                String::new()
            };
            for field in fields
                .iter()
                .filter(|f| **f != "csrf" && *path != "/logout")
            {
                let value = hostile_of(kind, &mut rng, &known);
                // The other fields right, so that the value goes as far
                // as it can (into the database, for the actions).
                let others: String = fields
                    .iter()
                    .filter(|f| **f != "csrf" && *f != field)
                    .map(|f| format!("&{f}={}", good(path, f, &ids[0])))
                    .collect();
                request(
                    method,
                    path,
                    path.replace("{id}", &ids[0]),
                    format!("{csrf_field}{field}={value}{others}"),
                    true,
                    "",
                );
            }
            if path.contains("{id}") {
                let value = hostile_of(kind, &mut rng, &known);
                request(
                    method,
                    path,
                    path.replace("{id}", &value),
                    String::new(),
                    true,
                    "",
                );
            }
        }
    }
    // Random mixtures: several hostile fields, repeated fields, unknown
    // and invalid names, thousands of fields, 16,000-segment paths.
    for round in 0..40 {
        for (method, path, fields) in ROUTES {
            if *path == "/login" && *method == "POST" && round % 8 != 0 {
                continue;
            }
            let mut pairs: Vec<String> = Vec::new();
            let mut names: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
            if rng.random_bool(0.1) {
                names.push(encode("\u{0}key"));
                names.push("%FF".to_string());
            }
            for name in &names {
                if rng.random_bool(0.3) {
                    continue;
                }
                let value = if name == "csrf" && rng.random_bool(0.8) {
                    csrf.clone()
                } else {
                    hostile(&mut rng, &known)
                };
                pairs.push(format!("{name}={value}"));
                if rng.random_bool(0.1) {
                    pairs.push(format!("{name}={}", hostile(&mut rng, &known)));
                }
            }
            if rng.random_bool(0.05) {
                for i in 0..rng.random_range(100..5_000) {
                    pairs.push(format!("k{i}=v"));
                }
            }
            let fields = pairs.join("&");
            if *path == "/logout" && fields.contains(&csrf) {
                continue; // keep the session for the rest
            }
            let mut target = path.replace("{id}", &hostile(&mut rng, &known));
            if rng.random_bool(0.05) {
                target = "/a".repeat(16_000);
            }
            let with_cookie = rng.random_bool(0.7);
            let mut extra = String::new();
            // Hostile headers too: a cookie, an origin, a fetch site.
            if rng.random_bool(0.15) {
                let h = [
                    "Cookie: pgwake_console=",
                    "Origin: ",
                    "Sec-Fetch-Site: ",
                    "Cookie: ",
                ]
                .choose(&mut rng)
                .unwrap();
                let v = match rng.random_range(0..4) {
                    0 => "x".repeat(rng.random_range(1..60_000)),
                    1 => ";".repeat(rng.random_range(1..10_000)),
                    2 => "null".to_string(),
                    _ => "http://evil.example".to_string(),
                };
                extra = format!("{h}{v}\r\n");
            }
            request(method, path, target, fields, with_cookie, &extra);
        }
    }
    let n = requests.len();
    let started = std::time::Instant::now();
    let addr = console.addr;
    // Eight at a time: more than the console's pool, fewer than the
    // descriptors a test may open.
    let answers: Vec<_> = futures::stream::iter(requests.into_iter().map(|(bytes, what)| {
        let size = bytes.len();
        tokio::spawn(async move { (send(addr, bytes, &what).await, size, what) })
    }))
    .buffer_unordered(8)
    .collect()
    .await;
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    let mut failures = Vec::new();
    for a in answers {
        let (answer, size, what) = a.expect("a request task");
        *by_status.entry(answer.status).or_default() += 1;
        if answer.status >= 500 {
            failures.push(format!("{} for {what}", answer.status));
        }
        // A connection closed without an answer: only for a request bigger
        // than the console reads.
        if answer.status == 0 && size <= 60_000 {
            failures.push(format!("no answer to {what}"));
        }
        // Refused input gets a page saying why; only the HTTP layer's own
        // refusals of what it cannot parse (414 URI too long, 431 headers
        // too large) come bare.
        if (400..500).contains(&answer.status)
            && ![414, 431].contains(&answer.status)
            && !answer.content_type.starts_with("text/html")
        {
            failures.push(format!(
                "a {} without a page ({}) for {what}",
                answer.status, answer.content_type
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} requests failed ({by_status:?}):\n{}",
        failures.len(),
        failures
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{n} hostile requests in {:.1} s: {by_status:?}",
        started.elapsed().as_secs_f64()
    );
    // Still serving, the session still valid.
    let r = http(console.addr, "GET", "/jobs", &[("Cookie", &cookie)], None).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("name=\"csrf\""), "{}", r.body);
}

/// The inputs of the report, one by one: each a 400 page saying what is
/// wrong, and the console still serving.
#[tokio::test]
async fn the_reported_inputs_get_a_400_page_naming_the_bound() {
    let db = migrated_db().await;
    let console = Console::start(&db, false).await;
    let deep = format!("/jobs?payload={}a%3D1", "a.".repeat(16_000));
    let nested = format!("/jobs?payload={}a%3D1", "a.".repeat(100));
    for (path, says) in [
        (deep.as_str(), "at most 8192"),
        (nested.as_str(), "at most 16 are accepted"),
        ("/jobs?queue=a%00b", "U+0000"),
        ("/jobs?task=%FF", "not valid UTF-8"),
        ("/jobs?queue=a&queue=b", "duplicate field"),
        ("/jobs?since=-4713-01-01", "between 1 and 9999"),
        ("/jobs/99999999999999999999", "not a whole number"),
        ("/queues?n=-99999999999999999999", "n"),
        ("/jobs?after=99999999999999999999", "not a job id"),
    ] {
        let r = get(&console, path).await;
        assert_eq!(r.status, 400, "{}: {}", &path[..path.len().min(80)], r.body);
        assert!(
            r.header("content-type")
                .unwrap_or("")
                .starts_with("text/html"),
            "{path}"
        );
        assert!(
            r.body.contains(says),
            "{}: {}",
            &path[..path.len().min(80)],
            r.body
        );
    }
    assert_eq!(get(&console, "/jobs").await.status, 200);
}
