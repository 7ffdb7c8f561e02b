-- begin_write
BEGIN

-- records.claim, returns Record [Scope, Key, Fingerprint, Token, Lease, Ttl]
WITH c AS (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now),
    held AS (
        SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at
        FROM "idem_records" WHERE scope = $1 AND key = $2),
    ins AS (
        INSERT INTO "idem_records"
            (scope, key, fingerprint, state, fence, claim_token, lease_until,
             created_at, expires_at)
        SELECT $1, $2, $3, 'in_progress', 1, $4, c.now + $5, c.now,
               c.now + GREATEST($5, $6)
        FROM c
        WHERE NOT EXISTS (SELECT 1 FROM held)
        ON CONFLICT (scope, key) DO NOTHING
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at),
    kept AS (
        UPDATE "idem_records_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM ins)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT ins.*, c.now AS db_now FROM ins, c
    UNION ALL
    SELECT held.*, c.now AS db_now FROM held, c

-- records.claimed [Scope, Key]
SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS db_now
    FROM "idem_records" WHERE scope = $1 AND key = $2

-- records.select [Scope, Key]
SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS db_now
    FROM "idem_records" WHERE scope = $1 AND key = $2

-- records.look [Scope, Key]
WITH c AS (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now),
    mark AS (
        UPDATE "idem_records" SET waited = true
        WHERE ctid = (
            SELECT ctid FROM "idem_records"
            WHERE scope = $1 AND key = $2 AND state = 'in_progress' AND NOT waited
            FOR UPDATE SKIP LOCKED)
          AND state = 'in_progress' AND NOT waited
        RETURNING scope, key, fingerprint, state, fence, claim_token, lease_until,
            outcome_kind, outcome, created_at, expires_at)
    SELECT mark.*, c.now AS db_now FROM mark, c
    UNION ALL
    SELECT t.scope, t.key, t.fingerprint, t.state, t.fence, t.claim_token, t.lease_until,
        t.outcome_kind, t.outcome, t.created_at, t.expires_at, c.now AS db_now
    FROM "idem_records" AS t, c
    WHERE t.scope = $1 AND t.key = $2 AND NOT EXISTS (SELECT 1 FROM mark)

-- records.renew [Scope, Key, Token, Lease]
UPDATE "idem_records" AS t
    SET lease_until = c.now + $4, expires_at = GREATEST(t.expires_at, c.now + $4)
    FROM (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now) AS c
    WHERE t.scope = $1 AND t.key = $2 AND t.claim_token = $3
      AND t.state = 'in_progress'

-- records.complete [OutcomeKind, Outcome, Ttl, Scope, Key, Token]
WITH done AS (
        UPDATE "idem_records"
        SET state = 'completed', outcome_kind = $1, outcome = $2,
            lease_until = NULL, expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $3
        WHERE scope = $4 AND key = $5 AND claim_token = $6
          AND (state = 'in_progress'
               OR (state = 'completed' AND outcome_kind = $1 AND outcome = $2))
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('idem_records', $5 || ' ' || $4) END FROM done

-- records.release [Scope, Key, Token]
WITH done AS (
        DELETE FROM "idem_records"
        WHERE scope = $1 AND key = $2 AND claim_token = $3 AND state = 'in_progress'
        RETURNING waited)
    SELECT CASE WHEN done.waited THEN pg_notify('idem_records', $2 || ' ' || $1) END FROM done

-- records.forget [Scope, Key]
WITH done AS (
        DELETE FROM "idem_records" WHERE scope = $1 AND key = $2
        RETURNING 1)
    SELECT pg_notify('idem_records', $2 || ' ' || $1) FROM done

-- records.purge [Batch]
DELETE FROM "idem_records"
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM "idem_records" WHERE expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT
        LIMIT $1 FOR UPDATE SKIP LOCKED))
      AND expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT

-- records.take_over [Scope, Key, Fingerprint, Token, Lease, Ttl]
WITH c AS (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now),
    taken AS (
    UPDATE "idem_records" AS t SET
        fingerprint = $3,
        state = 'in_progress',
        fence = t.fence + 1,
        claim_token = $4,
        lease_until = c.now + $5,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = c.now,
        expires_at = c.now + GREATEST($5, $6)
    FROM c
    WHERE t.scope = $1 AND t.key = $2
      AND (t.expires_at <= c.now
           OR (t.state = 'in_progress'
               AND t.lease_until <= c.now
               AND t.fingerprint = $3))
    RETURNING t.fence),
    kept AS (
        UPDATE "idem_records_steps" AS j SET expires_at = c.now + GREATEST($5, $6)
        FROM c
        WHERE j.scope = $1 AND j.key = $2 AND EXISTS (SELECT 1 FROM taken)
          AND j.expires_at > c.now AND j.expires_at < c.now + GREATEST($5, $6))
    SELECT fence FROM taken

-- journal.fence
SELECT claim_token, state FROM "idem_records" WHERE scope = $1 AND "key" = $2 FOR SHARE

-- journal.select
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS db_now FROM "idem_records_steps" WHERE scope = $1 AND "key" = $2 AND seq = $3 FOR UPDATE

-- journal.insert
INSERT INTO "idem_records_steps" (scope, "key", seq, name, fingerprint, state, claim_token, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5, 'started', $6, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $7)

-- journal.start
UPDATE "idem_records_steps" SET name = $1, fingerprint = $2, state = 'started', claim_token = $3, output = NULL, updated_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $4 WHERE scope = $5 AND "key" = $6 AND seq = $7

-- journal.complete
UPDATE "idem_records_steps" SET state = 'completed', claim_token = $1, output = $2, updated_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $3 WHERE scope = $4 AND "key" = $5 AND seq = $6 AND name = $7 AND state <> 'completed'

-- journal.list
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS db_now FROM "idem_records_steps" WHERE scope = $1 AND "key" = $2 ORDER BY seq

-- journal.resolve_completed
UPDATE "idem_records_steps" SET state = 'completed', output = $1, updated_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT WHERE scope = $2 AND "key" = $3 AND seq = $4 AND name = $5 AND state <> 'completed' AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AND NOT EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = "idem_records_steps".scope AND r."key" = "idem_records_steps"."key" AND r.claim_token = "idem_records_steps".claim_token AND r.state = 'in_progress' AND r.lease_until > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)

-- journal.resolve_rerun
UPDATE "idem_records_steps" SET state = 'rerun_allowed', updated_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT WHERE scope = $1 AND "key" = $2 AND seq = $3 AND name = $4 AND state <> 'completed' AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AND NOT EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = "idem_records_steps".scope AND r."key" = "idem_records_steps"."key" AND r.claim_token = "idem_records_steps".claim_token AND r.state = 'in_progress' AND r.lease_until > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)

-- journal.insert_fenced
INSERT INTO "idem_records_steps" (scope, "key", seq, name, fingerprint, state, claim_token, updated_at, expires_at) SELECT $1, $2, $3, $4, $5, 'started', $6, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $7 FROM "idem_records" AS r WHERE r.scope = $8 AND r."key" = $9 AND r.claim_token = $10 AND r.state = 'in_progress' FOR SHARE

-- journal.complete_fenced
UPDATE "idem_records_steps" SET state = 'completed', claim_token = $1, output = $2, updated_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $3 WHERE scope = $4 AND "key" = $5 AND seq = $6 AND name = $7 AND state <> 'completed' AND EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = $8 AND r."key" = $9 AND r.claim_token = $10 AND r.state = 'in_progress' FOR SHARE)

-- journal.forget
DELETE FROM "idem_records_steps" WHERE scope = $1 AND "key" = $2

-- journal.undo
DELETE FROM "idem_records_steps" WHERE scope = $1 AND "key" = $2 AND seq = $3 AND name = $4 AND state = 'started' AND claim_token = $5

-- journal.keep
UPDATE "idem_records_steps" SET expires_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $1 WHERE scope = $2 AND "key" = $3 AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AND expires_at < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $4

-- journal.purge
DELETE FROM "idem_records_steps" WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM "idem_records_steps" WHERE expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT LIMIT $1 FOR UPDATE SKIP LOCKED))
      AND expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT

-- outbox.insert_fenced
INSERT INTO "idem_records_outbox" (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT $1, $2, $3, $4, $5, 0, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $6 FROM "idem_records" AS r WHERE r.scope = $7 AND r."key" = $8 AND r.claim_token = $9 AND r.state = 'in_progress' FOR SHARE ON CONFLICT (message_id) DO NOTHING

-- outbox.insert
INSERT INTO "idem_records_outbox" (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT $1, $2, $3, $4, $5, 0, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $6 FROM (SELECT 1 AS one) AS r WHERE true ON CONFLICT (message_id) DO NOTHING

-- outbox.exists
SELECT COUNT(*) FROM "idem_records_outbox" WHERE message_id = $1

-- outbox.free
SELECT seq FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT) ORDER BY relayed_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED

-- outbox.leased
SELECT seq, message_id, topic, message_key, payload, headers, attempts FROM "idem_records_outbox" WHERE lease_token = $1 AND relayed_at IS NULL ORDER BY seq

-- outbox.purge
DELETE FROM "idem_records_outbox" WHERE seq IN (SELECT seq FROM "idem_records_outbox" WHERE relayed_at IS NOT NULL AND expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT ORDER BY seq LIMIT $1)

-- outbox.waiting
SELECT COUNT(*) FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NULL

-- outbox.park
UPDATE "idem_records_outbox" SET parked_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, parked_reason = $1, lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = $2 AND seq = $3

-- outbox.parked
SELECT seq, message_id, topic, message_key, payload, headers, attempts, parked_reason FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NOT NULL ORDER BY seq LIMIT $1

-- outbox.parked_count
SELECT COUNT(*) FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NOT NULL

-- outbox.lease(1)
UPDATE "idem_records_outbox" SET lease_until = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $1, lease_token = $2, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT) AND seq IN ($3)

-- outbox.lease(3)
UPDATE "idem_records_outbox" SET lease_until = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT + $1, lease_token = $2, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT) AND seq IN ($3, $4, $5)

-- outbox.mark(1)
UPDATE "idem_records_outbox" SET relayed_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN ($1)

-- outbox.mark(3)
UPDATE "idem_records_outbox" SET relayed_at = (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN ($1, $2, $3)

-- outbox.release(1)
UPDATE "idem_records_outbox" SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = $1 AND seq IN ($2)

-- outbox.release(3)
UPDATE "idem_records_outbox" SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = $1 AND seq IN ($2, $3, $4)

-- outbox.unpark(1)
UPDATE "idem_records_outbox" SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN ($1)

-- outbox.unpark(3)
UPDATE "idem_records_outbox" SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN ($1, $2, $3)

-- inventory.now
SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT

-- inventory.exists
SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass('"idem_records"')

-- inventory.with_key
SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM "idem_records" WHERE "key" = $1 ORDER BY scope

-- inventory.by_scope
SELECT scope, state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT THEN 1 END) AS expired FROM "idem_records" GROUP BY scope, state ORDER BY scope

-- inventory.oldest_in_progress
SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM "idem_records" WHERE state = 'in_progress' ORDER BY created_at LIMIT 1

-- inventory.steps
SELECT state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT THEN 1 END) AS expired FROM "idem_records_steps" GROUP BY state

-- inventory.steps_with_key
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS db_now FROM "idem_records_steps" WHERE "key" = $1 ORDER BY scope, seq

-- entity.find
SELECT * FROM "payments" WHERE "idempotency_token" = $1

-- entity.insert
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES ($1, $2, $3) ON CONFLICT ("idempotency_token") DO NOTHING RETURNING *

-- entity.upsert ["idempotency_token"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES ($1, $2, $3) ON CONFLICT ("idempotency_token") DO UPDATE SET "amount_cents" = excluded."amount_cents", "status" = excluded."status" RETURNING *

-- entity.upsert ["idempotency_token", "amount_cents", "status"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES ($1, $2, $3) ON CONFLICT ("idempotency_token", "amount_cents", "status") DO UPDATE SET "idempotency_token" = excluded."idempotency_token" RETURNING *

-- entity.upsert ["amount_cents", "status"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES ($1, $2, $3) ON CONFLICT ("amount_cents", "status") DO UPDATE SET "idempotency_token" = excluded."idempotency_token" RETURNING *

