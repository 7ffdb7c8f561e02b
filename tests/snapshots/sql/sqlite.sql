-- begin_write
BEGIN IMMEDIATE

-- records.claim, returns Fence [Scope, Key, Fingerprint, Token, Lease, Ttl]
INSERT INTO "idem_records"
        (scope, key, fingerprint, state, fence, claim_token, lease_until,
         created_at, expires_at)
    SELECT ?1, ?2, ?3, 'in_progress', 1, ?4, c.now + ?5, c.now, c.now + max(?5, ?6)
    FROM (SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS now) AS c WHERE true
    ON CONFLICT (scope, key) DO UPDATE SET
        fingerprint = excluded.fingerprint,
        state = 'in_progress',
        fence = "idem_records".fence + 1,
        claim_token = excluded.claim_token,
        lease_until = excluded.lease_until,
        outcome_kind = NULL,
        outcome = NULL,
        created_at = excluded.created_at,
        expires_at = excluded.expires_at
    WHERE "idem_records".expires_at <= excluded.created_at
       OR ("idem_records".state = 'in_progress'
           AND "idem_records".lease_until <= excluded.created_at
           AND "idem_records".fingerprint = excluded.fingerprint)
    RETURNING fence

-- records.claimed [Scope, Key]
SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now
    FROM "idem_records" WHERE scope = ?1 AND key = ?2

-- records.select [Scope, Key]
SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now
    FROM "idem_records" WHERE scope = ?1 AND key = ?2

-- records.look [Scope, Key]
SELECT scope, key, fingerprint, state, fence, claim_token, lease_until,
        outcome_kind, outcome, created_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now
    FROM "idem_records" WHERE scope = ?1 AND key = ?2

-- records.renew [Scope, Key, Token, Lease]
UPDATE "idem_records"
    SET lease_until = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?4, expires_at = max(expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?4)
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'

-- records.complete [OutcomeKind, Outcome, Ttl, Scope, Key, Token]
UPDATE "idem_records"
    SET state = 'completed', outcome_kind = ?1, outcome = ?2,
        lease_until = NULL, expires_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?3
    WHERE scope = ?4 AND key = ?5 AND claim_token = ?6
      AND (state = 'in_progress'
           OR (state = 'completed' AND outcome_kind = ?1 AND outcome = ?2))

-- records.release [Scope, Key, Token]
DELETE FROM "idem_records"
    WHERE scope = ?1 AND key = ?2 AND claim_token = ?3 AND state = 'in_progress'

-- records.forget [Scope, Key]
DELETE FROM "idem_records" WHERE scope = ?1 AND key = ?2

-- records.purge [Batch]
DELETE FROM "idem_records" WHERE rowid IN
    (SELECT rowid FROM "idem_records" WHERE expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) LIMIT ?1)

-- journal.fence
SELECT claim_token, state FROM "idem_records" WHERE scope = ?1 AND "key" = ?2

-- journal.select
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now FROM "idem_records_steps" WHERE scope = ?1 AND "key" = ?2 AND seq = ?3

-- journal.insert
INSERT INTO "idem_records_steps" (scope, "key", seq, name, fingerprint, state, claim_token, updated_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, 'started', ?6, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?7)

-- journal.start
UPDATE "idem_records_steps" SET name = ?1, fingerprint = ?2, state = 'started', claim_token = ?3, output = NULL, updated_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), expires_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?4 WHERE scope = ?5 AND "key" = ?6 AND seq = ?7

-- journal.complete
UPDATE "idem_records_steps" SET state = 'completed', claim_token = ?1, output = ?2, updated_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), expires_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?3 WHERE scope = ?4 AND "key" = ?5 AND seq = ?6 AND name = ?7 AND state <> 'completed'

-- journal.list
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now FROM "idem_records_steps" WHERE scope = ?1 AND "key" = ?2 ORDER BY seq

-- journal.resolve_completed
UPDATE "idem_records_steps" SET state = 'completed', output = ?1, updated_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) WHERE scope = ?2 AND "key" = ?3 AND seq = ?4 AND name = ?5 AND state <> 'completed' AND expires_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AND NOT EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = "idem_records_steps".scope AND r."key" = "idem_records_steps"."key" AND r.claim_token = "idem_records_steps".claim_token AND r.state = 'in_progress' AND r.lease_until > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))

-- journal.resolve_rerun
UPDATE "idem_records_steps" SET state = 'rerun_allowed', updated_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) WHERE scope = ?1 AND "key" = ?2 AND seq = ?3 AND name = ?4 AND state <> 'completed' AND expires_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AND NOT EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = "idem_records_steps".scope AND r."key" = "idem_records_steps"."key" AND r.claim_token = "idem_records_steps".claim_token AND r.state = 'in_progress' AND r.lease_until > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))

-- journal.insert_fenced
INSERT INTO "idem_records_steps" (scope, "key", seq, name, fingerprint, state, claim_token, updated_at, expires_at) SELECT ?1, ?2, ?3, ?4, ?5, 'started', ?6, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?7 FROM "idem_records" AS r WHERE r.scope = ?8 AND r."key" = ?9 AND r.claim_token = ?10 AND r.state = 'in_progress'

-- journal.complete_fenced
UPDATE "idem_records_steps" SET state = 'completed', claim_token = ?1, output = ?2, updated_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), expires_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?3 WHERE scope = ?4 AND "key" = ?5 AND seq = ?6 AND name = ?7 AND state <> 'completed' AND EXISTS (SELECT 1 FROM "idem_records" AS r WHERE r.scope = ?8 AND r."key" = ?9 AND r.claim_token = ?10 AND r.state = 'in_progress')

-- journal.forget
DELETE FROM "idem_records_steps" WHERE scope = ?1 AND "key" = ?2

-- journal.undo
DELETE FROM "idem_records_steps" WHERE scope = ?1 AND "key" = ?2 AND seq = ?3 AND name = ?4 AND state = 'started' AND claim_token = ?5

-- journal.keep
UPDATE "idem_records_steps" SET expires_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?1 WHERE scope = ?2 AND "key" = ?3 AND expires_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AND expires_at < CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?4

-- journal.purge
DELETE FROM "idem_records_steps" WHERE rowid IN
    (SELECT rowid FROM "idem_records_steps" WHERE expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) LIMIT ?1)

-- outbox.insert_fenced
INSERT INTO "idem_records_outbox" (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT ?1, ?2, ?3, ?4, ?5, 0, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?6 FROM "idem_records" AS r WHERE r.scope = ?7 AND r."key" = ?8 AND r.claim_token = ?9 AND r.state = 'in_progress' ON CONFLICT (message_id) DO NOTHING

-- outbox.insert
INSERT INTO "idem_records_outbox" (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT ?1, ?2, ?3, ?4, ?5, 0, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?6 FROM (SELECT 1 AS one) AS r WHERE true ON CONFLICT (message_id) DO NOTHING

-- outbox.exists
SELECT COUNT(*) FROM "idem_records_outbox" WHERE message_id = ?1

-- outbox.free
SELECT seq FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) ORDER BY relayed_at, seq LIMIT ?1

-- outbox.leased
SELECT seq, message_id, topic, message_key, payload, headers, attempts FROM "idem_records_outbox" WHERE lease_token = ?1 AND relayed_at IS NULL ORDER BY seq

-- outbox.purge
DELETE FROM "idem_records_outbox" WHERE seq IN (SELECT seq FROM "idem_records_outbox" WHERE relayed_at IS NOT NULL AND expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) ORDER BY seq LIMIT ?1)

-- outbox.waiting
SELECT COUNT(*) FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NULL

-- outbox.park
UPDATE "idem_records_outbox" SET parked_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), parked_reason = ?1, lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ?2 AND seq = ?3

-- outbox.parked
SELECT seq, message_id, topic, message_key, payload, headers, attempts, parked_reason FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NOT NULL ORDER BY seq LIMIT ?1

-- outbox.parked_count
SELECT COUNT(*) FROM "idem_records_outbox" WHERE relayed_at IS NULL AND parked_at IS NOT NULL

-- outbox.lease(1)
UPDATE "idem_records_outbox" SET lease_until = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?1, lease_token = ?2, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) AND seq IN (?3)

-- outbox.lease(3)
UPDATE "idem_records_outbox" SET lease_until = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) + ?1, lease_token = ?2, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) AND seq IN (?3, ?4, ?5)

-- outbox.mark(1)
UPDATE "idem_records_outbox" SET relayed_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN (?1)

-- outbox.mark(3)
UPDATE "idem_records_outbox" SET relayed_at = CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER), lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN (?1, ?2, ?3)

-- outbox.release(1)
UPDATE "idem_records_outbox" SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ?1 AND seq IN (?2)

-- outbox.release(3)
UPDATE "idem_records_outbox" SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ?1 AND seq IN (?2, ?3, ?4)

-- outbox.unpark(1)
UPDATE "idem_records_outbox" SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN (?1)

-- outbox.unpark(3)
UPDATE "idem_records_outbox" SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN (?1, ?2, ?3)

-- inventory.now
SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)

-- inventory.exists
SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_records'

-- inventory.with_key
SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM "idem_records" WHERE "key" = ?1 ORDER BY scope

-- inventory.by_scope
SELECT scope, state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) THEN 1 END) AS expired FROM "idem_records" GROUP BY scope, state ORDER BY scope

-- inventory.oldest_in_progress
SELECT scope, "key", fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM "idem_records" WHERE state = 'in_progress' ORDER BY created_at LIMIT 1

-- inventory.steps
SELECT state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) THEN 1 END) AS expired FROM "idem_records_steps" GROUP BY state

-- inventory.steps_with_key
SELECT scope, "key", seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) AS db_now FROM "idem_records_steps" WHERE "key" = ?1 ORDER BY scope, seq

-- entity.find
SELECT * FROM "payments" WHERE "idempotency_token" = ?1

-- entity.insert
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES (?1, ?2, ?3) ON CONFLICT ("idempotency_token") DO NOTHING RETURNING *

-- entity.upsert ["idempotency_token"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES (?1, ?2, ?3) ON CONFLICT ("idempotency_token") DO UPDATE SET "amount_cents" = excluded."amount_cents", "status" = excluded."status" RETURNING *

-- entity.upsert ["idempotency_token", "amount_cents", "status"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES (?1, ?2, ?3) ON CONFLICT ("idempotency_token", "amount_cents", "status") DO UPDATE SET "idempotency_token" = excluded."idempotency_token" RETURNING *

-- entity.upsert ["amount_cents", "status"]
INSERT INTO "payments" ("idempotency_token", "amount_cents", "status") VALUES (?1, ?2, ?3) ON CONFLICT ("amount_cents", "status") DO UPDATE SET "idempotency_token" = excluded."idempotency_token" RETURNING *

