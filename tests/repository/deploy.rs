//! The deployment files of `deploy/` agree with the code: the supervisors
//! wait longer than a stopping worker can take, the probes and the scrape
//! reach the worker's endpoint, the flags passed exist, and the image does
//! not run as root. (Their syntax and schemas are `.ci/deploy`'s:
//! `systemd-analyze verify`, kubernetes-validate.)
//!
//! The Kubernetes manifests are read with a small indentation reader made
//! for these files: a key it cannot find fails the test, naming the file.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `src/worker.rs`'s `HARD_DEADLINE` (crate-private): how long, after the
/// grace period, the worker waits for running jobs to be handed back.
fn hard_deadline() -> Duration {
    let source = read("src/worker.rs");
    let decl = "const HARD_DEADLINE: Duration = Duration::from_secs(";
    let at = source
        .find(decl)
        .unwrap_or_else(|| panic!("src/worker.rs no longer declares `{decl}N)`: read the hard deadline from where it went"));
    let rest = &source[at + decl.len()..];
    rest[..rest.find(')').unwrap()]
        .parse()
        .map(Duration::from_secs)
        .unwrap()
}

/// The latest a worker can still be alive after SIGTERM with this grace
/// period: the watchdog of `src/signals.rs` exits then.
fn latest_exit(grace: Duration) -> Duration {
    let signals = read("src/signals.rs");
    assert!(
        signals.contains("watchdog(grace + HARD_DEADLINE + EXIT_MARGIN,"),
        "src/signals.rs: the watchdog after the first signal is no longer grace + HARD_DEADLINE + \
         EXIT_MARGIN; update latest_exit here and the timeline of docs/src/deploying.md"
    );
    grace + hard_deadline() + pgwake::signals::EXIT_MARGIN
}

/// The grace period a command line sets, else the default.
fn grace_of(args: &[String]) -> Duration {
    let given = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--grace-period=")
            .map(str::to_string)
            .or_else(|| (a == "--grace-period").then(|| args[i + 1].clone()))
    });
    match given {
        Some(g) => humantime::parse_duration(&g).unwrap(),
        None => pgwake::config::GRACE_PERIOD_DEFAULT,
    }
}

/// The value of `--metrics-addr` on a command line, if given.
fn metrics_addr_of(args: &[String]) -> Option<SocketAddr> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--metrics-addr=")
            .map(str::to_string)
            .or_else(|| (a == "--metrics-addr").then(|| args[i + 1].clone()))
            .map(|v| v.parse().unwrap())
    })
}

// ---- systemd ------------------------------------------------------------

/// A unit's `Key=value` settings of `[Service]`, in order, continuation
/// lines joined.
fn unit_settings(text: &str) -> Vec<(String, String)> {
    let joined = text.replace("\\\n", " ");
    let mut section = "";
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if section == "[Service]" && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
    }
    out
}

fn setting<'a>(settings: &'a [(String, String)], key: &str, unit: &str) -> &'a str {
    settings
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("{unit}: no {key}="))
}

/// `ExecStart=` as words, the program first.
fn exec_start(settings: &[(String, String)], unit: &str) -> Vec<String> {
    shell_words::split(setting(settings, "ExecStart", unit)).unwrap()
}

const WORKER_UNIT: &str = "deploy/systemd/pgwake.service";
const MIGRATE_UNIT: &str = "deploy/systemd/pgwake-migrate.service";
const CONSOLE_UNIT: &str = "deploy/systemd/pgwake-ui.service";

/// `cli/commands/ui.rs`'s `STOP_GRACE` (the binary's): how long `pgwake ui`
/// lets requests finish after SIGTERM before its watchdog counts down.
fn console_stop_grace() -> Duration {
    let source = read("cli/commands/ui.rs");
    let decl = "const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(";
    let at = source
        .find(decl)
        .unwrap_or_else(|| panic!("cli/commands/ui.rs no longer declares `{decl}N)`"));
    let rest = &source[at + decl.len()..];
    rest[..rest.find(')').unwrap()]
        .parse()
        .map(Duration::from_secs)
        .unwrap()
}

#[test]
fn systemd_waits_longer_than_a_stopping_worker_can_take() {
    let settings = unit_settings(&read(WORKER_UNIT));
    let args = exec_start(&settings, WORKER_UNIT);
    let latest = latest_exit(grace_of(&args));
    let timeout =
        humantime::parse_duration(setting(&settings, "TimeoutStopSec", WORKER_UNIT)).unwrap();
    assert!(
        timeout > latest,
        "{WORKER_UNIT}: TimeoutStopSec {timeout:?} must be above {latest:?} (grace period + \
         hard deadline + exit margin), or systemd SIGKILLs a worker still handing jobs back"
    );
    assert_eq!(setting(&settings, "KillSignal", WORKER_UNIT), "SIGTERM");
    // SIGTERM to pgwake alone: its exec commands must run on through the
    // grace period, not get the signal from systemd at once.
    assert_eq!(setting(&settings, "KillMode", WORKER_UNIT), "mixed");
}

#[test]
fn systemd_units_run_pgwake_with_flags_that_exist_and_no_password() {
    for (unit, command) in [
        (WORKER_UNIT, "run"),
        (MIGRATE_UNIT, "migrate"),
        (CONSOLE_UNIT, "ui"),
    ] {
        let settings = unit_settings(&read(unit));
        let args = exec_start(&settings, unit);
        assert_eq!(args[0], "/usr/local/bin/pgwake", "{unit}: ExecStart");
        assert_eq!(args[1], command, "{unit}: ExecStart");
        flags_exist(unit, &args[1..]);
        assert!(
            !args.iter().any(|a| a.contains("postgres://") || a.contains("postgresql://")),
            "{unit}: a database URL on the command line (every local user sees it): use EnvironmentFile"
        );
        assert!(setting(&settings, "EnvironmentFile", unit).starts_with("/etc/pgwake/"));
        assert_ne!(setting(&settings, "User", unit), "root", "{unit}: User");
        assert_eq!(setting(&settings, "NoNewPrivileges", unit), "yes", "{unit}");
        assert_eq!(
            setting(&settings, "ProtectSystem", unit),
            "strict",
            "{unit}"
        );
    }
    for unit in [WORKER_UNIT, CONSOLE_UNIT] {
        let settings = unit_settings(&read(unit));
        assert_eq!(setting(&settings, "Type", unit), "exec");
        assert_eq!(setting(&settings, "Restart", unit), "on-failure");
        assert_eq!(setting(&settings, "RestartPreventExitStatus", unit), "2");
    }
}

/// The units that stay up are bounded as a whole: `exec:` commands share
/// the worker's cgroup, so without `MemoryMax=`/`TasksMax=` one leaking or
/// fork-looping command takes the host. And the worker's unit says how a
/// handler under /home runs, which `ProtectHome=yes` hides.
#[test]
fn systemd_units_bound_memory_and_tasks_and_say_where_handlers_live() {
    for unit in [WORKER_UNIT, CONSOLE_UNIT] {
        let settings = unit_settings(&read(unit));
        for key in ["MemoryMax", "TasksMax"] {
            let value = setting(&settings, key, unit);
            assert!(
                !value.is_empty() && value != "infinity",
                "{unit}: {key}={value}: bound it"
            );
        }
    }
    let worker = read(WORKER_UNIT);
    assert_eq!(
        setting(&unit_settings(&worker), "ProtectHome", WORKER_UNIT),
        "yes"
    );
    assert!(
        worker.contains("ProtectHome=read-only in the drop-in"),
        "{WORKER_UNIT}: say how a handler under /home runs"
    );
    let book = read("docs/src/deploying.md");
    for needle in ["MemoryMax=", "TasksMax=", "ProtectHome=read-only"] {
        assert!(
            book.contains(needle),
            "docs/src/deploying.md lacks {needle}"
        );
    }
}

#[test]
fn the_console_unit_waits_longer_than_a_stopping_console_can_take() {
    let settings = unit_settings(&read(CONSOLE_UNIT));
    let latest = console_stop_grace() + hard_deadline() + pgwake::signals::EXIT_MARGIN;
    let timeout =
        humantime::parse_duration(setting(&settings, "TimeoutStopSec", CONSOLE_UNIT)).unwrap();
    assert!(
        timeout > latest,
        "{CONSOLE_UNIT}: TimeoutStopSec {timeout:?} <= {latest:?}"
    );
    assert_eq!(
        setting(&settings, "EnvironmentFile", CONSOLE_UNIT),
        "/etc/pgwake/console.env",
        "the credential's file, as docs/src/deploying.md says"
    );
    let args = exec_start(&settings, CONSOLE_UNIT);
    for flag in ["--ui-actions", "--ui-secure-cookie", "--ui-host"] {
        assert!(args.iter().any(|a| a == flag), "{CONSOLE_UNIT}: {flag}");
    }
}

/// Every `--flag` of `args` (a subcommand first) is in that subcommand's
/// `--help`.
fn flags_exist(file: &str, args: &[String]) {
    let help = run_pgwake(&[args[0].as_str(), "--help"], None);
    assert!(help.status.success(), "{file}: pgwake {} --help", args[0]);
    let help = String::from_utf8_lossy(&help.stdout);
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")),
            "{file}: pgwake {} has no {flag}",
            args[0]
        );
    }
}

// ---- Kubernetes ----------------------------------------------------------

const WORKER_MANIFEST: &str = "deploy/kubernetes/worker.yaml";
const MIGRATE_MANIFEST: &str = "deploy/kubernetes/migrate-job.yaml";
const SERVICE_MONITOR: &str = "deploy/kubernetes/prometheus-operator/servicemonitor.yaml";
const CONSOLE_MANIFEST: &str = "deploy/kubernetes/console.yaml";

/// A YAML document's lines without comments and blank lines.
struct Doc {
    file: String,
    lines: Vec<String>,
}

/// The document of `kind` in `file`.
fn doc(file: &str, kind: &str) -> Doc {
    let text = read(file);
    for part in text.split("\n---\n") {
        let lines: Vec<String> = part
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(str::to_string)
            .collect();
        if lines.iter().any(|l| l == &format!("kind: {kind}")) {
            return Doc {
                file: format!("{file} ({kind})"),
                lines,
            };
        }
    }
    panic!("{file}: no {kind}");
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// A line's key and value: `  - name: x` is ("name", "x"); a list item
/// without a key is ("", item).
fn key_value(line: &str) -> (&str, &str) {
    let t = line.trim_start();
    let t = t.strip_prefix("- ").unwrap_or(t);
    match t.split_once(':') {
        Some((k, v)) if !k.contains(' ') && !k.starts_with('"') => (k, v.trim()),
        _ => ("", t),
    }
}

fn unquote(v: &str) -> String {
    v.trim_matches('"').trim_matches('\'').to_string()
}

impl Doc {
    /// The lines under the first `key:` (those indented deeper than it).
    fn block(&self, key: &str) -> Doc {
        let at = self
            .lines
            .iter()
            .position(|l| key_value(l).0 == key)
            .unwrap_or_else(|| panic!("{}: no {key}", self.file));
        // The key's own column: after a list item's "- ".
        let own = indent(&self.lines[at])
            + if self.lines[at].trim_start().starts_with("- ") {
                2
            } else {
                0
            };
        let lines = self.lines[at + 1..]
            .iter()
            .take_while(|l| {
                indent(l) > own || (indent(l) == own && l.trim_start().starts_with("- "))
            })
            .cloned()
            .collect();
        Doc {
            file: format!("{}: {key}", self.file),
            lines,
        }
    }

    /// The value of the first `key:` (a scalar).
    fn get(&self, key: &str) -> String {
        self.lines
            .iter()
            .map(|l| key_value(l))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| unquote(v))
            .unwrap_or_else(|| panic!("{}: no {key}", self.file))
    }

    /// The items of a list of scalars, in block (`- a`) or flow (`["a"]`) form.
    fn list(&self, key: &str) -> Vec<String> {
        let (_, inline) = self
            .lines
            .iter()
            .map(|l| key_value(l))
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("{}: no {key}", self.file));
        if let Some(flow) = inline.strip_prefix('[') {
            return flow
                .trim_end_matches(']')
                .split(',')
                .map(|s| unquote(s.trim()))
                .collect();
        }
        self.block(key)
            .lines
            .iter()
            .map(|l| {
                unquote(
                    l.trim_start().strip_prefix("- ").unwrap_or_else(|| {
                        panic!("{}: {key}: {l:?} is not a list item", self.file)
                    }),
                )
            })
            .collect()
    }

    /// `key: value` pairs of a map of scalars.
    fn map(&self, key: &str) -> Vec<(String, String)> {
        self.block(key)
            .lines
            .iter()
            .map(|l| {
                let (k, v) = key_value(l);
                (k.to_string(), unquote(v))
            })
            .collect()
    }
}

fn seconds(doc: &Doc, key: &str) -> Duration {
    Duration::from_secs(doc.get(key).parse().unwrap())
}

#[test]
fn kubernetes_waits_longer_than_a_stopping_worker_can_take() {
    let deployment = doc(WORKER_MANIFEST, "Deployment");
    let args = deployment.block("containers").list("args");
    let latest = latest_exit(grace_of(&args));
    let grace = seconds(&deployment, "terminationGracePeriodSeconds");
    assert!(
        grace > latest,
        "{WORKER_MANIFEST}: terminationGracePeriodSeconds {grace:?} must be above {latest:?} \
         (grace period + hard deadline + exit margin), or the kubelet SIGKILLs a worker still \
         handing jobs back"
    );
}

#[test]
fn kubernetes_probes_and_scrapes_reach_the_workers_endpoint() {
    let deployment = doc(WORKER_MANIFEST, "Deployment");
    let container = deployment.block("containers");
    let args = container.list("args");
    assert_eq!(args[0], "run");
    flags_exist(WORKER_MANIFEST, &args);

    // The endpoint listens on every address of the pod (the kubelet and
    // Prometheus come from outside it), on the port the container declares.
    let addr = metrics_addr_of(&args)
        .unwrap_or_else(|| panic!("{WORKER_MANIFEST}: no --metrics-addr (the default is loopback, out of the kubelet's reach)"));
    assert!(addr.ip().is_unspecified(), "{WORKER_MANIFEST}: --metrics-addr {addr} is not reachable from outside the pod: bind 0.0.0.0");
    assert_eq!(
        addr.port(),
        pgwake::config::METRICS_ADDR_DEFAULT.port(),
        "{WORKER_MANIFEST}: the documented port"
    );
    let ports = container.block("ports");
    let port_name = ports.get("name");
    assert_eq!(
        ports.get("containerPort"),
        addr.port().to_string(),
        "{WORKER_MANIFEST}: containerPort"
    );

    // The probes: paths the endpoint serves, on that port.
    let endpoint = read("src/endpoint.rs");
    for (probe, path) in [("livenessProbe", "/health"), ("readinessProbe", "/ready")] {
        let probe = container.block(probe);
        assert_eq!(probe.get("path"), path, "{}", probe.file);
        assert!(
            [port_name.clone(), addr.port().to_string()].contains(&probe.get("port")),
            "{}: port {} is not the endpoint's",
            probe.file,
            probe.get("port")
        );
        assert!(
            endpoint.contains(&format!(".route(\"{path}\",")),
            "src/endpoint.rs no longer serves {path}"
        );
    }
    assert!(endpoint.contains(".route(\"/metrics\","));

    // Annotation-based scraping.
    let annotations = deployment.map("annotations");
    for (k, v) in [
        ("prometheus.io/scrape", "true".to_string()),
        ("prometheus.io/port", addr.port().to_string()),
        ("prometheus.io/path", "/metrics".to_string()),
    ] {
        assert!(
            annotations.contains(&(k.to_string(), v.clone())),
            "{WORKER_MANIFEST}: pod annotation {k}: {v:?} missing: {annotations:?}"
        );
    }

    // Service → pods, ServiceMonitor → Service, by labels and port name.
    let pod_labels = deployment.block("template").map("labels");
    let service = doc(WORKER_MANIFEST, "Service");
    let service_labels = service.block("metadata").map("labels");
    for (k, v) in service.map("selector") {
        assert!(
            pod_labels.contains(&(k.clone(), v.clone())),
            "{}: selector {k}={v} matches no worker pod",
            service.file
        );
    }
    let service_port = service.block("ports");
    assert_eq!(
        service_port.get("targetPort"),
        port_name,
        "{}: targetPort",
        service.file
    );
    assert_eq!(
        service.get("publishNotReadyAddresses"),
        "true",
        "{}: not-ready workers must stay scraped",
        service.file
    );

    let monitor = doc(SERVICE_MONITOR, "ServiceMonitor");
    for (k, v) in monitor.block("selector").map("matchLabels") {
        assert!(
            service_labels.contains(&(k.clone(), v.clone())),
            "{}: selector {k}={v} does not select the Service",
            monitor.file
        );
    }
    let endpoint = monitor.block("endpoints");
    assert_eq!(
        endpoint.get("port"),
        service_port.get("name"),
        "{}: port",
        monitor.file
    );
    assert_eq!(endpoint.get("path"), "/metrics", "{}: path", monitor.file);
}

#[test]
fn kubernetes_takes_the_database_url_from_a_secret() {
    for (file, kind, command) in [
        (WORKER_MANIFEST, "Deployment", "run"),
        (MIGRATE_MANIFEST, "Job", "migrate"),
        (CONSOLE_MANIFEST, "Deployment", "ui"),
    ] {
        let container = doc(file, kind).block("containers");
        let args = container.list("args");
        assert_eq!(args[0], command, "{file}");
        flags_exist(file, &args);
        let env = container.block("env");
        let at = env
            .lines
            .iter()
            .position(|l| l.trim_start() == "- name: DATABASE_URL")
            .unwrap_or_else(|| panic!("{file}: no DATABASE_URL in env"));
        let from = Doc {
            file: format!("{file}: DATABASE_URL"),
            lines: env.lines[at..].to_vec(),
        };
        from.block("valueFrom").block("secretKeyRef").get("name");
        let manifest = doc(file, kind);
        assert!(
            !manifest
                .lines
                .iter()
                .any(|l| l.contains("postgres://") || l.contains("postgresql://")),
            "{file}: a database URL in the manifest: it belongs in the Secret"
        );
    }
}

/// The console's pod: off loopback (the Service reaches the pod's IP), so
/// every page needs the login, with the credential from the Secret; one
/// replica (sessions live in memory); TLS at the Ingress, and the cookie
/// says so; the Service and the Ingress reach its port; the kubelet's
/// SIGKILL comes after its watchdog.
#[test]
fn kubernetes_serves_the_console_behind_tls_with_a_credential_from_a_secret() {
    let deployment = doc(CONSOLE_MANIFEST, "Deployment");
    assert_eq!(deployment.get("replicas"), "1", "{CONSOLE_MANIFEST}");
    let container = deployment.block("containers");
    let args = container.list("args");
    let at = args.iter().position(|a| a == "--ui-addr").unwrap();
    let addr: SocketAddr = args[at + 1].parse().unwrap();
    assert!(
        addr.ip().is_unspecified(),
        "{CONSOLE_MANIFEST}: --ui-addr {addr}"
    );
    assert!(
        !args.iter().any(|a| a == "--ui-open-reads"),
        "{CONSOLE_MANIFEST}"
    );
    assert!(
        args.iter().any(|a| a == "--ui-secure-cookie"),
        "{CONSOLE_MANIFEST}"
    );
    let host = &args[args.iter().position(|a| a == "--ui-host").unwrap() + 1];
    let env = container.block("env");
    let at = env
        .lines
        .iter()
        .position(|l| l.trim_start() == "- name: PGWAKE_UI_TOKEN")
        .unwrap_or_else(|| panic!("{CONSOLE_MANIFEST}: no PGWAKE_UI_TOKEN in env"));
    Doc {
        file: format!("{CONSOLE_MANIFEST}: PGWAKE_UI_TOKEN"),
        lines: env.lines[at..].to_vec(),
    }
    .block("valueFrom")
    .block("secretKeyRef")
    .get("name");
    let port = container.block("ports");
    assert_eq!(port.get("containerPort"), addr.port().to_string());
    let name = port.get("name");
    assert_eq!(
        doc(CONSOLE_MANIFEST, "Service")
            .block("ports")
            .get("targetPort"),
        name
    );
    let ingress = doc(CONSOLE_MANIFEST, "Ingress");
    assert_eq!(ingress.block("tls").list("hosts"), vec![host.clone()]);
    assert_eq!(ingress.block("rules").get("host"), *host);
    let latest = console_stop_grace() + hard_deadline() + pgwake::signals::EXIT_MARGIN;
    assert!(seconds(&deployment, "terminationGracePeriodSeconds") > latest);
}

// ---- the image -----------------------------------------------------------

#[test]
fn the_image_and_the_pods_run_as_the_same_unprivileged_user() {
    let dockerfile = read("deploy/Dockerfile");
    let last_stage = dockerfile.rsplit("\nFROM ").next().unwrap();
    let user = last_stage
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("deploy/Dockerfile: the runtime stage sets no USER (it would run as root)");
    let (uid, gid) = user.trim().split_once(':').unwrap_or((user.trim(), ""));
    // Numeric: Kubernetes' runAsNonRoot can only check a numeric user.
    let uid: u32 = uid
        .parse()
        .unwrap_or_else(|_| panic!("deploy/Dockerfile: USER {user} is not numeric"));
    assert_ne!(uid, 0, "deploy/Dockerfile: USER {user} is root");
    assert!(
        last_stage.contains("ENTRYPOINT [\"pgwake\"]"),
        "deploy/Dockerfile: ENTRYPOINT"
    );
    assert!(
        last_stage.contains("CMD [\"run\"]"),
        "deploy/Dockerfile: CMD"
    );

    for (file, kind) in [
        (WORKER_MANIFEST, "Deployment"),
        (MIGRATE_MANIFEST, "Job"),
        (CONSOLE_MANIFEST, "Deployment"),
    ] {
        let pod = doc(file, kind).block("template").block("spec");
        let security = pod.block("securityContext");
        assert_eq!(security.get("runAsNonRoot"), "true", "{}", security.file);
        assert_eq!(
            security.get("runAsUser"),
            uid.to_string(),
            "{}: the image's user",
            security.file
        );
        if !gid.is_empty() {
            assert_eq!(
                security.get("runAsGroup"),
                gid,
                "{}: the image's group",
                security.file
            );
        }
        let container = pod.block("containers").block("securityContext");
        assert_eq!(
            container.get("readOnlyRootFilesystem"),
            "true",
            "{}",
            container.file
        );
        assert_eq!(
            container.get("allowPrivilegeEscalation"),
            "false",
            "{}",
            container.file
        );
    }
}

// ---- KEDA ----------------------------------------------------------------

const KEDA_MANIFEST: &str = "deploy/kubernetes/keda/scaledobject.yaml";

/// A document's `metadata.namespace`, if it names one.
fn namespace_of(doc: &Doc) -> Option<String> {
    let metadata = doc.block("metadata");
    metadata
        .lines
        .iter()
        .map(|l| key_value(l))
        .find(|(k, _)| *k == "namespace")
        .map(|(_, v)| unquote(v))
}

/// The `pgwake.<name>(<arguments>)` calls of a query, in order.
fn pgwake_calls(query: &str) -> Vec<(String, String)> {
    let mut calls = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("pgwake.") {
        rest = &rest[at + "pgwake.".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let after = &rest[name.len()..];
        if let Some(args) = after.strip_prefix('(') {
            let args = &args[..args.find(')').expect("a call without its ')'")];
            calls.push((name, args.trim().to_string()));
        }
    }
    calls
}

/// The ScaledObject scales the worker Deployment of worker.yaml (its name,
/// kind, namespace, labels), aims at the worker's --concurrency per
/// replica, reads its connection from a Secret through the
/// TriggerAuthentication it names, and its query calls pgwake functions
/// that `functions/` defines, over every queue the worker works; run on a
/// migrated database it returns one number, the jobs a worker would run.
///
/// Teeth (each tried): another Deployment name, a misspelt function, a
/// target other than --concurrency, or one queue while the worker works
/// every queue fails it.
#[tokio::test]
async fn keda_scales_the_worker_deployment_on_a_function_that_exists() {
    let deployment = doc(WORKER_MANIFEST, "Deployment");
    let scaled = doc(KEDA_MANIFEST, "ScaledObject");
    let target = scaled.block("scaleTargetRef");
    assert_eq!(
        target.get("name"),
        deployment.block("metadata").get("name"),
        "{}: the Deployment of {WORKER_MANIFEST}",
        target.file
    );
    assert_eq!(target.get("kind"), "Deployment", "{}", target.file);
    assert_eq!(target.get("apiVersion"), "apps/v1", "{}", target.file);
    assert_eq!(
        namespace_of(&scaled),
        namespace_of(&deployment),
        "{KEDA_MANIFEST}: a ScaledObject scales a Deployment of its own namespace"
    );
    let labels = scaled.block("metadata").map("labels");
    let name_label = deployment
        .block("metadata")
        .map("labels")
        .into_iter()
        .find(|(k, _)| k == "app.kubernetes.io/name")
        .expect("worker.yaml: no app.kubernetes.io/name label");
    assert!(
        labels.contains(&name_label),
        "{KEDA_MANIFEST}: labels {labels:?} without {name_label:?}"
    );

    let args = deployment.block("containers").list("args");
    let concurrency = args
        .iter()
        .position(|a| a == "--concurrency")
        .map(|i| args[i + 1].clone())
        .unwrap_or_else(|| pgwake::WorkerConfig::default().concurrency.to_string());
    let trigger = scaled.block("triggers");
    assert_eq!(trigger.get("type"), "postgresql", "{}", trigger.file);
    let metadata = trigger.block("metadata");
    assert_eq!(
        metadata.get("targetQueryValue"),
        concurrency,
        "{}: the jobs one worker runs at once (its --concurrency)",
        metadata.file
    );

    // The connection: a Secret, through the TriggerAuthentication named.
    let auth = doc(KEDA_MANIFEST, "TriggerAuthentication");
    assert_eq!(
        trigger.block("authenticationRef").get("name"),
        auth.block("metadata").get("name"),
        "{}: authenticationRef",
        trigger.file
    );
    assert_eq!(
        namespace_of(&auth),
        namespace_of(&scaled),
        "{KEDA_MANIFEST}"
    );
    let secret = auth.block("secretTargetRef");
    assert_eq!(secret.get("parameter"), "connection", "{}", secret.file);
    secret.get("name");
    for d in [&scaled, &auth] {
        assert!(
            !d.lines.iter().any(|l| l.contains("postgres://")
                || l.contains("postgresql://")
                || l.contains("password")),
            "{}: a credential in the manifest: it belongs in the Secret",
            d.file
        );
    }
    assert!(
        !metadata.lines.iter().any(|l| {
            let k = key_value(l).0;
            k == "connectionFromEnv" || k == "passwordFromEnv"
        }),
        "{}: the connection comes from the TriggerAuthentication",
        metadata.file
    );

    // The query: functions that exist, over the worker's queues.
    let query = metadata.get("query");
    let calls = pgwake_calls(&query);
    assert!(
        !calls.is_empty(),
        "{KEDA_MANIFEST}: the query calls no pgwake function: {query}"
    );
    let functions: String =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("functions"))
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect();
    for (name, call_args) in &calls {
        assert!(
            functions.contains(&format!("CREATE OR REPLACE FUNCTION pgwake.{name}(")),
            "{KEDA_MANIFEST}: the query calls pgwake.{name}, which functions/ does not define"
        );
        if *name == "queue_pressure" {
            assert!(
                args.iter().any(|a| a.starts_with("--queues")) != call_args.is_empty(),
                "{KEDA_MANIFEST}: pgwake.queue_pressure({call_args}) must cover the worker's \
                 queues: every queue (no argument) unless worker.yaml passes --queues"
            );
        }
    }
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task) SELECT 'a', 'report' FROM generate_series(1, 3);
         INSERT INTO pgwake.jobs (queue, task) SELECT 'b', 'report' FROM generate_series(1, 2);",
    )
    .await
    .unwrap();
    let rows = c.query(&query, &[]).await.unwrap_or_else(|e| {
        panic!("{KEDA_MANIFEST}: the query fails on a migrated database: {e:?}")
    });
    assert_eq!(rows.len(), 1, "{KEDA_MANIFEST}: KEDA reads one row");
    assert_eq!(rows[0].len(), 1, "{KEDA_MANIFEST}: KEDA reads one number");
    let demand: i64 = rows[0].get(0);
    assert_eq!(demand, 5, "{KEDA_MANIFEST}: the jobs waiting for a worker");
}

// ---- the console's role --------------------------------------------------

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

/// docs/src/deploying.md ("The console") gives a read-only console the
/// monitor's grants: every page answers 200 to that role, none with a
/// refused statement. Teeth: as a role without grants, the overview
/// answers with "permission denied".
#[tokio::test]
async fn a_read_only_console_serves_every_page_to_the_monitor_role() {
    use std::io::BufRead;
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dp_console') THEN
                 CREATE ROLE dp_console LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
             END IF;
         END $$;
         GRANT CONNECT ON DATABASE {} TO dp_console;
         SELECT pgwake.grant_monitor('dp_console');
         SELECT pgwake.enqueue('report', '{{}}');",
        db.name
    ))
    .await
    .unwrap();
    let id: i64 = db.scalar("SELECT max(id) FROM pgwake.jobs").await;
    let url = db.url.replacen("://postgres", "://dp_console:pw", 1);
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &url)
        .args(["ui", "--ui-addr", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut bad = Vec::new();
    for path in [
        "/".to_string(),
        "/jobs".into(),
        format!("/jobs/{id}"),
        "/queues".into(),
        "/workers".into(),
        "/schedules".into(),
    ] {
        let page = http_get(&addr, &path);
        if !page.starts_with("HTTP/1.0 200") && !page.starts_with("HTTP/1.1 200")
            || page.contains("permission denied")
        {
            bad.push(format!("{path}: {}", &page[..page.len().min(2000)]));
        }
    }
    send_signal(&child, libc::SIGTERM);
    wait_exit(child, Duration::from_secs(30)).await;
    assert!(bad.is_empty(), "{bad:#?}");
}
