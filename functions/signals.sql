-- Signals (issue 37, item 4; migration 0042): a handler's job waits for a
-- key (`Outcome::WaitFor`), and anyone — SQL in any language, `pgwake
-- signal KEY`, the Rust client — wakes it with
--
--   SELECT pgwake.signal('payment:42', '{"paid": true}');
--
-- which returns how many jobs it woke. Each waiting job gets the payload
-- (the handler reads it with `JobContext::signal`) and is due now; a worker
-- waiting for work is woken by a NOTIFY as the insert trigger does
-- (functions/notify.sql), so the resume is prompt, not at the next poll.
--
-- A signal that wakes no job is kept (pgwake.signals, one row per key: a
-- second signal for the key replaces the first's payload) for `keep`, 24
-- hours by default, at most 7 days; `keep => '0'` keeps nothing. The first
-- wait for its key that begins while it is kept takes it: that job (with
-- every other job then waiting for the key) resumes at once with its
-- payload, and the kept signal is gone. So a signal sent just before the
-- job waits is not lost, and a job that waits twice for one key does not
-- receive one signal twice. Kept signals expire in the rescuer's round;
-- past 100,000 kept signals the oldest go first (src/db/sql/signals_expire.sql).
--
-- A signal and the beginning of a wait for the same key are serialised by
-- a transaction-scoped advisory lock of the key (pgwake.signal_lock), taken
-- by both before they look at the other's table: one of them sees the
-- other, so a signal is either delivered or kept, never neither.
--
-- Bounds: a key of 1 to 1024 bytes (the bound of ordering and unique keys)
-- with no control characters, a payload of at most 65,536 bytes of JSON
-- text.

CREATE OR REPLACE FUNCTION pgwake.signal_lock(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'70677369'::bigint << 32) | (hashtext(key)::bigint & x'ffffffff'::bigint)
$$;

-- Refuse what no signal may carry, naming the bound.
CREATE OR REPLACE FUNCTION pgwake.signal_check(key text, payload jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF key IS NULL OR key = '' THEN
        RAISE EXCEPTION 'pgwake.signal: the key is empty'
            USING ERRCODE = '22023', HINT = 'Name what the jobs wait for, e.g. ''payment:42''.';
    END IF;
    IF octet_length(key) > 1024 THEN
        RAISE EXCEPTION 'pgwake.signal: the key is % bytes, over the bound of 1024', octet_length(key)
            USING ERRCODE = '22023',
                  HINT = 'Use a short key (an id, a hash of a longer name) as the job waits with.';
    END IF;
    IF key ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgwake.signal: the key has a control character'
            USING ERRCODE = '22023', HINT = 'Use printable characters only (e.g. ''payment:42'').';
    END IF;
    IF payload IS NOT NULL AND octet_length(payload::text) > 65536 THEN
        RAISE EXCEPTION 'pgwake.signal: the payload is % bytes of JSON, over the bound of 65536',
                octet_length(payload::text)
            USING ERRCODE = '22023',
                  HINT = 'Send a reference (an id, a path) and keep the data elsewhere.';
    END IF;
END
$$;

-- Hand `payload` to every job waiting for `key` and make it due now; the
-- caller holds the key's lock. A waiting job is one still in pgwake.jobs
-- with the run_at its wait gave it; a row a claim holds (its timeout came,
-- it runs) is skipped: that run resumes timed out. Returns how many woke.
CREATE OR REPLACE FUNCTION pgwake.deliver_signal(key text, payload jsonb) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    woke integer;
    queues text[];
    q text;
BEGIN
    WITH waiting AS (
        SELECT j.id FROM pgwake.jobs j
        JOIN pgwake.job_waits w ON w.job_id = j.id
        WHERE w.signal_key = deliver_signal.key AND w.signal_state = 'waiting'
          AND w.kind = 'signal' AND j.run_at = w.wait_until
        FOR UPDATE OF j SKIP LOCKED
    ),
    marked AS (
        UPDATE pgwake.job_waits w
        SET signal_state = 'received', signal_payload = deliver_signal.payload,
            signalled_at = now()
        FROM waiting
        WHERE w.job_id = waiting.id
        RETURNING w.job_id
    ),
    due AS (
        UPDATE pgwake.jobs j SET run_at = now()
        FROM marked WHERE j.id = marked.job_id
        RETURNING j.queue
    )
    SELECT count(*), array_agg(DISTINCT due.queue) INTO woke, queues FROM due;
    IF woke > 0 AND current_setting('pgwake.notify', true) IS DISTINCT FROM 'off' THEN
        -- As the insert trigger: one NOTIFY per queue some idle worker waits on.
        FOR q IN
            SELECT n.queue FROM unnest(queues) AS n(queue)
            WHERE EXISTS (SELECT 1 FROM pgwake.waiting_workers ww
                          WHERE ww.expires_at > now()
                            AND (ww.queues IS NULL OR n.queue = ANY (ww.queues)))
        LOOP
            PERFORM pg_notify('pgwake', q);
        END LOOP;
    END IF;
    RETURN woke;
END
$$;

-- Send a signal (see the top of this file). SECURITY DEFINER: a producer
-- (pgwake.grant_producer) may signal without UPDATE on pgwake.jobs.
CREATE OR REPLACE FUNCTION pgwake.signal(key text, payload jsonb DEFAULT NULL,
                                         keep interval DEFAULT interval '24 hours')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    woke integer;
BEGIN
    PERFORM pgwake.signal_check(key, payload);
    IF keep IS NULL OR keep < interval '0' OR keep > interval '7 days' THEN
        RAISE EXCEPTION 'pgwake.signal: keep % is not between 0 and 7 days', keep
            USING ERRCODE = '22023',
                  HINT = 'A signal nobody waits for is kept at most 7 days (24 hours by default).';
    END IF;
    PERFORM pg_advisory_xact_lock(pgwake.signal_lock(key));
    woke := pgwake.deliver_signal(key, payload);
    IF woke = 0 AND keep > interval '0' THEN
        INSERT INTO pgwake.signals AS s (key, payload, sent_at, keep_until)
        VALUES (signal.key, signal.payload, now(), now() + signal.keep)
        ON CONFLICT ON CONSTRAINT signals_pkey DO UPDATE
            SET payload = excluded.payload, sent_at = excluded.sent_at,
                keep_until = excluded.keep_until;
    END IF;
    RETURN woke;
END
$$;

-- Jobs that began to wait for these keys (the worker calls it once their
-- waits are written: in tx mode in the claim transaction, in lease mode
-- right after the statement that wrote them): a key with a kept signal
-- has it delivered now, to every job waiting for it, and the kept signal
-- is gone. Keys are locked in one order (no deadlock between two callers).
-- Returns how many jobs woke.
CREATE OR REPLACE FUNCTION pgwake.take_kept_signals(keys text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    k text;
    p jsonb;
    n integer;
    woke integer := 0;
BEGIN
    -- In the order of the locks themselves: two keys may share one.
    FOR k IN SELECT d.k FROM (SELECT DISTINCT u.k FROM unnest(keys) AS u(k)) d
             ORDER BY pgwake.signal_lock(d.k), d.k
    LOOP
        PERFORM pg_advisory_xact_lock(pgwake.signal_lock(k));
    END LOOP;
    FOR k IN SELECT DISTINCT u.k FROM unnest(keys) AS u(k) ORDER BY 1 LOOP
        SELECT s.payload INTO p FROM pgwake.signals s
        WHERE s.key = k AND s.keep_until > now();
        IF FOUND THEN
            n := pgwake.deliver_signal(k, p);
            -- Kept until a job takes it (none may: their rows were held).
            IF n > 0 THEN
                DELETE FROM pgwake.signals s WHERE s.key = k;
                woke := woke + n;
            END IF;
        END IF;
    END LOOP;
    RETURN woke;
END
$$;
