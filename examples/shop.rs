//! An embedder's program: a small HTTP service that takes orders and does
//! the slow work after the response, with pgwake as a library.
//!
//! - `POST /orders?email=…&item=…` inserts the order **and enqueues its two
//!   jobs in the same transaction**: either the order and its jobs exist,
//!   or none of them does.
//! - The worker in the same process runs two handlers: `record_sale` in
//!   `tx` mode (its write commits with the job's removal, exactly once) and
//!   `send_receipt` in `lease` mode (work outside the database; no
//!   connection is held while it runs).
//! - SIGTERM or Ctrl-C stops both gracefully: the HTTP server finishes its
//!   requests, the worker claims nothing more and gives running jobs the
//!   grace period; a second signal hands them back at once.
//!
//! ```text
//! cargo run --example shop -- postgres://localhost/shop 127.0.0.1:3000
//! curl -X POST 'http://127.0.0.1:3000/orders?email=ada@example.com&item=book'
//! ```
//!
//! The service migrates pgwake's schema at start (an application may
//! instead run `pgwake migrate` in its deployment) and creates its own two
//! tables if they are missing.

use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use pgwake::client::{self, NewJob};
use pgwake::connect::{self, DbConfig};
use pgwake::deadpool_postgres::Pool;
use pgwake::{
    async_trait, BoxError, CancellationToken, Delivery, Handler, Job, JobContext, Outcome,
};
use serde::Deserialize;
use serde_json::json;

/// The application's own tables.
const APP_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS shop_orders (
        id bigserial PRIMARY KEY,
        email text NOT NULL,
        item text NOT NULL,
        created_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE IF NOT EXISTS shop_sales (
        order_id bigint PRIMARY KEY REFERENCES shop_orders (id),
        recorded_at timestamptz NOT NULL DEFAULT now()
    );";

/// The longest email or item name the service accepts.
const FIELD_MAX: usize = 200;

/// `tx` mode (the default): the insert goes through the claim transaction,
/// so the sale is recorded exactly when the job is removed.
struct RecordSale;

#[async_trait]
impl Handler for RecordSale {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let order: i64 = serde_json::from_value(job.payload["order"].clone())?;
        let tx = ctx
            .transaction()
            .await?
            .ok_or("record_sale runs in tx mode")?;
        tx.execute(
            "INSERT INTO shop_sales (order_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&order],
        )
        .await?;
        Ok(Outcome::Done)
    }
}

/// `lease` mode: a call to a mail service would go here. No connection is
/// held while it runs; an `Err` is a failed attempt, retried with backoff.
struct SendReceipt;

#[async_trait]
impl Handler for SendReceipt {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let email = job.payload["email"]
            .as_str()
            .ok_or("no email in the payload")?;
        tokio::select! {
            // Stands for the mail service's round trip.
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            // Timeout, lost lease or shutdown past the grace period.
            _ = ctx.cancelled().cancelled() => return Err("cancelled".into()),
        }
        println!(
            "receipt for order {} sent to {email:?}",
            job.payload["order"]
        );
        Ok(Outcome::Done)
    }

    fn delivery(&self) -> Delivery {
        Delivery::Lease
    }
}

#[derive(Deserialize)]
struct OrderForm {
    email: String,
    item: String,
}

/// Insert the order and enqueue its jobs in one transaction.
async fn create_order(
    State(pool): State<Pool>,
    Query(form): Query<OrderForm>,
) -> Result<String, (StatusCode, String)> {
    for (name, value) in [("email", &form.email), ("item", &form.item)] {
        if value.is_empty() || value.len() > FIELD_MAX {
            let why = format!("{name} must be 1 to {FIELD_MAX} bytes\n");
            return Err((StatusCode::BAD_REQUEST, why));
        }
    }
    let failed = |e: &dyn std::fmt::Display| {
        eprintln!("order not taken: {e}");
        (StatusCode::SERVICE_UNAVAILABLE, "try again\n".to_string())
    };
    let mut conn = pool.get().await.map_err(|e| failed(&e))?;
    let tx = conn.transaction().await.map_err(|e| failed(&e))?;
    let row = tx
        .query_one(
            "INSERT INTO shop_orders (email, item) VALUES ($1, $2) RETURNING id",
            &[&form.email, &form.item],
        )
        .await
        .map_err(|e| failed(&e))?;
    let order: i64 = row.get(0);
    let jobs = [
        NewJob::new("record_sale", json!({ "order": order })),
        NewJob::new(
            "send_receipt",
            json!({ "order": order, "email": form.email }),
        ),
    ];
    client::enqueue_many(&*tx, &jobs)
        .await
        .map_err(|e| failed(&e))?;
    tx.commit().await.map_err(|e| failed(&e))?;
    Ok(format!("order {order}\n"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(addr)) = (args.next(), args.next()) else {
        return Err(
            "usage: shop DATABASE_URL LISTEN_ADDR (e.g. postgres://localhost/shop 127.0.0.1:3000)"
                .into(),
        );
    };
    let db: DbConfig = connect::parse_url(&url)?;

    // Schema: pgwake's, then the application's.
    let mut admin = connect::connect(&db).await?;
    pgwake::admin::schema::migrate(&mut admin).await?;
    admin.batch_execute(APP_SCHEMA).await?;
    drop(admin);

    let worker = pgwake::Worker::builder(db.clone())
        .handler("record_sale", RecordSale)
        .handler("send_receipt", SendReceipt)
        .build()?;

    // First signal: stop (no new claims, the grace period for running
    // jobs, the HTTP server drains). Second: abort (hand jobs back now).
    let (stop, abort) = (CancellationToken::new(), CancellationToken::new());
    pgwake::signals::spawn(stop.clone(), abort.clone(), worker.config().grace_period)?;

    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(connect::pool(&db, 4)?);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("taking orders on http://{}/orders", listener.local_addr()?);
    let http = axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned());

    let (served, worked) = tokio::join!(async { http.await }, worker.run(stop, abort));
    served?;
    worked?;
    Ok(())
}
