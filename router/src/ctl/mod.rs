//! `ownerserve ctl`: the operator API (`/admin/v1`) from the command line. Each subcommand
//! is one API call; the answer is printed as a table (or key/value lines), or as the
//! API's own JSON with `--json`. The token comes from `--token` or
//! `OWNERSERVE_ADMIN_TOKEN`; API errors (401, 403, 404, ...) are printed with their
//! meaning and the command exits non-zero.
//!
//! - `client`: the HTTP calls and their errors.
//! - `views`: the tables for each answer; `table` lays them out.
//! - `directory`: backups of the directory and the data folders restored from them.

mod client;
mod directory;
mod table;
mod views;

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use axum::http::Method;
use clap::Subcommand;
use serde_json::Value;

use client::Api;
use ownerserve_edge::process::say;

/// Flags of `ownerserve ctl`.
#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    /// The router (or directory node) to talk to.
    #[arg(
        long,
        global = true,
        env = "OWNERSERVE_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
    /// Bearer token: admin, or read-only for the commands that only read.
    #[arg(
        long,
        global = true,
        env = "OWNERSERVE_ADMIN_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Prefix artifacts with their owner, epoch, copies and references (or one, by key).
    Owners { key: Option<u64> },
    /// Worker leases with their remaining TTL and attached keys (or one, by id).
    Leases { id: Option<u64> },
    /// Revoke a lease: its keys pass to a live copy-holder or are marked for recompute.
    Revoke { id: u64 },
    /// Sessions with their decode owner, epoch and forks (or one, by id).
    Sessions { id: Option<String> },
    /// Pin a session to its decode owner (`--off` unpins).
    Pin {
        id: String,
        #[arg(long)]
        off: bool,
    },
    /// End a session.
    Release { id: String },
    /// Move a session to the worker of another lease.
    Transfer { id: String, lease: u64 },
    /// Workers with health, drain, in-flight requests and scraped load (router only).
    Workers,
    /// The sessions this router tracks: owner, context, and while parked the lifecycle's
    /// course and where their KV is; what session admission counts (router only).
    Lifecycle,
    /// Drain a worker: no new work; its sessions move off on their next step (router only).
    Drain { name: String },
    /// End a worker's drain (router only).
    Undrain { name: String },
    /// Raft status of the directory: leader, term, indexes, voters, learners. Against a
    /// router of a remote cluster: every node's status and the router's replica (applied
    /// index, age of its last entry); `--router` adds other routers' replicas.
    Cluster {
        /// Another router to show the replica of (repeatable).
        #[arg(long = "router")]
        routers: Vec<String>,
    },
    /// The directory's backups: `backup FILE` from a running cluster, `restore FILE` into
    /// a new node's data folder.
    Directory {
        #[command(subcommand)]
        command: directory::DirectoryCommand,
    },
    /// The plan the router would choose for a chat request, with every candidate's costs,
    /// without running it (router only). The body is read from `--file` or stdin.
    Explain {
        /// A chat-completions request body (JSON); `-` or none reads stdin.
        #[arg(long)]
        file: Option<PathBuf>,
        /// The session the step belongs to (`x-session-id`).
        #[arg(long)]
        session: Option<String>,
        /// Explain the step as a fork of its session.
        #[arg(long)]
        fork: bool,
    },
}

/// `/admin/v1/cluster` of `url`, with each router's replica (its own and `routers`') in
/// `routers`.
async fn cluster(
    api: &Api,
    url: &str,
    routers: &[String],
    token: Option<&String>,
) -> anyhow::Result<Value> {
    let mut answer = api.get("/admin/v1/cluster").await?;
    if answer.get("replica").is_none() {
        // A directory node, not a router: its own status is the answer.
        return Ok(answer);
    }
    let mut replicas = vec![serde_json::json!({"router": url, "replica": answer["replica"]})];
    for r in routers {
        let other = Api::new(r, token.cloned())?
            .get("/admin/v1/cluster")
            .await?;
        replicas.push(serde_json::json!({"router": r, "replica": other["replica"]}));
    }
    answer["routers"] = Value::Array(replicas);
    Ok(answer)
}

/// Runs one `ctl` command.
#[expect(
    clippy::too_many_lines,
    reason = "one arm per subcommand, each a request and its view; not the request path"
)]
pub async fn run(args: CtlArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.url, args.token.clone())?;
    let (answer, view): (Value, fn(&Value) -> String) = match args.command {
        CtlCommand::Directory { command } => {
            let (answer, words) = directory::run(&api, command).await?;
            say(&if args.json {
                serde_json::to_string_pretty(&answer)?
            } else {
                words
            });
            return Ok(());
        }
        CtlCommand::Owners { key } => match key {
            Some(k) => (
                api.get(&format!("/admin/v1/owners/{k}")).await?,
                views::owner,
            ),
            None => (api.get("/admin/v1/owners").await?, views::owners),
        },
        CtlCommand::Leases { id } => match id {
            Some(i) => (
                api.get(&format!("/admin/v1/leases/{i}")).await?,
                views::lease,
            ),
            None => (api.get("/admin/v1/leases").await?, views::leases),
        },
        CtlCommand::Revoke { id } => (
            api.call(Method::DELETE, &format!("/admin/v1/leases/{id}"), None, &[])
                .await?,
            views::write,
        ),
        CtlCommand::Sessions { id } => match id {
            Some(i) => (
                api.get(&format!("/admin/v1/sessions/{}", client::segment(&i)))
                    .await?,
                views::session,
            ),
            None => (api.get("/admin/v1/sessions").await?, views::sessions),
        },
        CtlCommand::Pin { id, off } => (
            api.call(
                Method::POST,
                &format!("/admin/v1/sessions/{}/pin", client::segment(&id)),
                Some(serde_json::json!({"pinned": !off})),
                &[],
            )
            .await?,
            views::write,
        ),
        CtlCommand::Release { id } => (
            api.call(
                Method::POST,
                &format!("/admin/v1/sessions/{}/release", client::segment(&id)),
                None,
                &[],
            )
            .await?,
            views::write,
        ),
        CtlCommand::Transfer { id, lease } => (
            api.call(
                Method::POST,
                &format!("/admin/v1/sessions/{}/transfer", client::segment(&id)),
                Some(serde_json::json!({"lease": lease})),
                &[],
            )
            .await?,
            views::write,
        ),
        CtlCommand::Workers => (api.get("/admin/v1/workers").await?, views::workers),
        CtlCommand::Lifecycle => (api.get("/admin/v1/lifecycle").await?, views::lifecycle),
        CtlCommand::Drain { name } => (
            api.call(
                Method::POST,
                &format!("/admin/v1/workers/{}/drain", client::segment(&name)),
                None,
                &[],
            )
            .await?,
            views::drain,
        ),
        CtlCommand::Undrain { name } => (
            api.call(
                Method::DELETE,
                &format!("/admin/v1/workers/{}/drain", client::segment(&name)),
                None,
                &[],
            )
            .await?,
            views::drain,
        ),
        CtlCommand::Cluster { routers } => (
            cluster(&api, &args.url, &routers, args.token.as_ref()).await?,
            views::cluster,
        ),
        CtlCommand::Explain {
            file,
            session,
            fork,
        } => {
            let body = read_body(file.as_ref())?;
            let mut headers = Vec::new();
            if let Some(s) = session {
                headers.push((crate::api::headers::SESSION_ID, s));
            }
            if fork {
                headers.push((crate::api::headers::FORK, "true".to_owned()));
            }
            (
                api.call(Method::POST, "/admin/v1/plan/explain", Some(body), &headers)
                    .await?,
                views::explain,
            )
        }
    };
    if args.json {
        say(&serde_json::to_string_pretty(&answer)?);
    } else {
        say(view(&answer).trim_end());
    }
    Ok(())
}

/// The explain request's body, from a file or stdin.
fn read_body(file: Option<&PathBuf>) -> anyhow::Result<Value> {
    let text = match file.filter(|p| p.as_os_str() != "-") {
        Some(p) => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?
        }
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read the request body from stdin")?;
            s
        }
    };
    serde_json::from_str(&text).context("the request body is not JSON")
}
