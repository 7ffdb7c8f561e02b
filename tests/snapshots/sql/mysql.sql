-- begin_write
BEGIN

-- records.claim, returns Record [Scope, Key, Fingerprint, Lease, Token, Lease, Ttl]
INSERT INTO `idem_records`
        (scope, `key`, fingerprint, state, fence, lease_until, claim_token, created_at, expires_at)
    VALUES (?, ?, ?, 'in_progress', 1, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + GREATEST(?, ?))
    ON DUPLICATE KEY UPDATE
        claim_token  = IF((`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint))), VALUES(claim_token), `idem_records`.claim_token),
        fence        = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), `idem_records`.fence + 1, `idem_records`.fence),
        outcome_kind = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), NULL, `idem_records`.outcome_kind),
        outcome      = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), NULL, `idem_records`.outcome),
        fingerprint  = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(fingerprint), `idem_records`.fingerprint),
        state        = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), 'in_progress', `idem_records`.state),
        lease_until  = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(lease_until), `idem_records`.lease_until),
        created_at   = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(created_at), `idem_records`.created_at),
        expires_at   = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(expires_at), `idem_records`.expires_at) RETURNING scope, `key`, fingerprint, state, fence, lease_until, outcome_kind,
        outcome, claim_token, created_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now

-- records.claimed [Scope, Key]
SELECT scope, `key`, fingerprint, state, fence, lease_until, outcome_kind,
        outcome, claim_token, created_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records` WHERE scope = ? AND `key` = ? FOR UPDATE

-- records.select [Scope, Key]
SELECT scope, `key`, fingerprint, state, fence, lease_until, outcome_kind,
        outcome, claim_token, created_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records` WHERE scope = ? AND `key` = ?

-- records.look [Scope, Key]
SELECT scope, `key`, fingerprint, state, fence, lease_until, outcome_kind,
        outcome, claim_token, created_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records` WHERE scope = ? AND `key` = ?

-- records.renew [Lease, Lease, Scope, Key, Token]
UPDATE `idem_records`
    SET lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?, expires_at = GREATEST(expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?)
    WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'

-- records.complete [OutcomeKind, Outcome, Ttl, Scope, Key, Token, OutcomeKind, Outcome]
UPDATE `idem_records`
    SET outcome_kind = ?, outcome = ?, lease_until = NULL, expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?,
        state = 'completed'
    WHERE scope = ? AND `key` = ? AND claim_token = ?
      AND (state = 'in_progress'
           OR (state = 'completed' AND outcome_kind = ? AND outcome = ?))

-- records.release [Scope, Key, Token]
DELETE FROM `idem_records`
    WHERE scope = ? AND `key` = ? AND claim_token = ? AND state = 'in_progress'

-- records.forget [Scope, Key]
DELETE FROM `idem_records` WHERE scope = ? AND `key` = ?

-- records.purge [Batch]
DELETE FROM `idem_records` WHERE expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) ORDER BY expires_at LIMIT ?

-- records.claim_without_returning [Scope, Key, Fingerprint, Lease, Token, Lease, Ttl]
INSERT INTO `idem_records`
        (scope, `key`, fingerprint, state, fence, lease_until, claim_token, created_at, expires_at)
    VALUES (?, ?, ?, 'in_progress', 1, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?, ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + GREATEST(?, ?))
    ON DUPLICATE KEY UPDATE
        claim_token  = IF((`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint))), VALUES(claim_token), `idem_records`.claim_token),
        fence        = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), `idem_records`.fence + 1, `idem_records`.fence),
        outcome_kind = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), NULL, `idem_records`.outcome_kind),
        outcome      = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), NULL, `idem_records`.outcome),
        fingerprint  = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(fingerprint), `idem_records`.fingerprint),
        state        = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), 'in_progress', `idem_records`.state),
        lease_until  = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(lease_until), `idem_records`.lease_until),
        created_at   = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(created_at), `idem_records`.created_at),
        expires_at   = IF((`idem_records`.claim_token = VALUES(claim_token) OR (`idem_records`.expires_at <= VALUES(created_at)
            OR (`idem_records`.state = 'in_progress'
                AND `idem_records`.lease_until <= VALUES(created_at)
                AND `idem_records`.fingerprint = VALUES(fingerprint)))), VALUES(expires_at), `idem_records`.expires_at)

-- journal.fence
SELECT claim_token, state FROM `idem_records` WHERE scope = ? AND `key` = ? LOCK IN SHARE MODE

-- journal.select
SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records_steps` WHERE scope = ? AND `key` = ? AND seq = ? FOR UPDATE

-- journal.insert
INSERT INTO `idem_records_steps` (scope, `key`, seq, name, fingerprint, state, claim_token, updated_at, expires_at) VALUES (?, ?, ?, ?, ?, 'started', ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?)

-- journal.start
UPDATE `idem_records_steps` SET name = ?, fingerprint = ?, state = 'started', claim_token = ?, output = NULL, updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? WHERE scope = ? AND `key` = ? AND seq = ?

-- journal.complete
UPDATE `idem_records_steps` SET state = 'completed', claim_token = ?, output = ?, updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed'

-- journal.list
SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records_steps` WHERE scope = ? AND `key` = ? ORDER BY seq

-- journal.resolve_completed
UPDATE `idem_records_steps` SET state = 'completed', output = ?, updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed' AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AND NOT EXISTS (SELECT 1 FROM `idem_records` AS r WHERE r.scope = `idem_records_steps`.scope AND r.`key` = `idem_records_steps`.`key` AND r.claim_token = `idem_records_steps`.claim_token AND r.state = 'in_progress' AND r.lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000))

-- journal.resolve_rerun
UPDATE `idem_records_steps` SET state = 'rerun_allowed', updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed' AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AND NOT EXISTS (SELECT 1 FROM `idem_records` AS r WHERE r.scope = `idem_records_steps`.scope AND r.`key` = `idem_records_steps`.`key` AND r.claim_token = `idem_records_steps`.claim_token AND r.state = 'in_progress' AND r.lease_until > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000))

-- journal.insert_fenced
INSERT INTO `idem_records_steps` (scope, `key`, seq, name, fingerprint, state, claim_token, updated_at, expires_at) SELECT ?, ?, ?, ?, ?, 'started', ?, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? FROM `idem_records` AS r WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ? AND r.state = 'in_progress' LOCK IN SHARE MODE

-- journal.complete_fenced
UPDATE `idem_records_steps` SET state = 'completed', claim_token = ?, output = ?, updated_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state <> 'completed' AND EXISTS (SELECT 1 FROM `idem_records` AS r WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ? AND r.state = 'in_progress' LOCK IN SHARE MODE)

-- journal.forget
DELETE FROM `idem_records_steps` WHERE scope = ? AND `key` = ?

-- journal.undo
DELETE FROM `idem_records_steps` WHERE scope = ? AND `key` = ? AND seq = ? AND name = ? AND state = 'started' AND claim_token = ?

-- journal.keep
UPDATE `idem_records_steps` SET expires_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? WHERE scope = ? AND `key` = ? AND expires_at > (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AND expires_at < (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?

-- journal.purge
DELETE FROM `idem_records_steps` WHERE expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) ORDER BY expires_at LIMIT ?

-- outbox.insert_fenced
INSERT INTO `idem_records_outbox` (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT ?, ?, ?, ?, ?, 0, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? FROM `idem_records` AS r WHERE r.scope = ? AND r.`key` = ? AND r.claim_token = ? AND r.state = 'in_progress' LOCK IN SHARE MODE ON DUPLICATE KEY UPDATE message_id = message_id

-- outbox.insert
INSERT INTO `idem_records_outbox` (message_id, topic, message_key, payload, headers, attempts, created_at, expires_at) SELECT ?, ?, ?, ?, ?, 0, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ? FROM (SELECT 1 AS one) AS r WHERE true ON DUPLICATE KEY UPDATE message_id = message_id

-- outbox.exists
SELECT COUNT(*) FROM `idem_records_outbox` WHERE message_id = ?

-- outbox.free
SELECT seq FROM `idem_records_outbox` WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)) ORDER BY relayed_at, seq LIMIT ? FOR UPDATE SKIP LOCKED

-- outbox.leased
SELECT seq, message_id, topic, message_key, payload, headers, attempts FROM `idem_records_outbox` WHERE lease_token = ? AND relayed_at IS NULL ORDER BY seq

-- outbox.purge
DELETE FROM `idem_records_outbox` WHERE relayed_at IS NOT NULL AND expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) ORDER BY seq LIMIT ?

-- outbox.waiting
SELECT COUNT(*) FROM `idem_records_outbox` WHERE relayed_at IS NULL AND parked_at IS NULL

-- outbox.park
UPDATE `idem_records_outbox` SET parked_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), parked_reason = ?, lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ? AND seq = ?

-- outbox.parked
SELECT seq, message_id, topic, message_key, payload, headers, attempts, parked_reason FROM `idem_records_outbox` WHERE relayed_at IS NULL AND parked_at IS NOT NULL ORDER BY seq LIMIT ?

-- outbox.parked_count
SELECT COUNT(*) FROM `idem_records_outbox` WHERE relayed_at IS NULL AND parked_at IS NOT NULL

-- outbox.lease(1)
UPDATE `idem_records_outbox` SET lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?, lease_token = ?, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)) AND seq IN (?)

-- outbox.lease(3)
UPDATE `idem_records_outbox` SET lease_until = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) + ?, lease_token = ?, attempts = attempts + 1 WHERE relayed_at IS NULL AND parked_at IS NULL AND (lease_until IS NULL OR lease_until <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)) AND seq IN (?, ?, ?)

-- outbox.mark(1)
UPDATE `idem_records_outbox` SET relayed_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN (?)

-- outbox.mark(3)
UPDATE `idem_records_outbox` SET relayed_at = (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000), lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND seq IN (?, ?, ?)

-- outbox.release(1)
UPDATE `idem_records_outbox` SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ? AND seq IN (?)

-- outbox.release(3)
UPDATE `idem_records_outbox` SET lease_until = NULL, lease_token = NULL WHERE relayed_at IS NULL AND lease_token = ? AND seq IN (?, ?, ?)

-- outbox.unpark(1)
UPDATE `idem_records_outbox` SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN (?)

-- outbox.unpark(3)
UPDATE `idem_records_outbox` SET parked_at = NULL, parked_reason = NULL WHERE relayed_at IS NULL AND parked_at IS NOT NULL AND seq IN (?, ?, ?)

-- inventory.now
SELECT (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)

-- inventory.exists
SELECT COUNT(*) FROM information_schema.tables
        WHERE table_schema = DATABASE() AND table_name = 'idem_records'

-- inventory.with_key
SELECT scope, `key`, fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM `idem_records` WHERE `key` = ? ORDER BY scope

-- inventory.by_scope
SELECT scope, state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN 1 END) AS expired FROM `idem_records` GROUP BY scope, state ORDER BY scope

-- inventory.oldest_in_progress
SELECT scope, `key`, fingerprint, state, fence, claim_token, lease_until, outcome_kind, outcome, created_at, expires_at FROM `idem_records` WHERE state = 'in_progress' ORDER BY created_at LIMIT 1

-- inventory.steps
SELECT state, COUNT(*) AS n, COUNT(CASE WHEN expires_at <= (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) THEN 1 END) AS expired FROM `idem_records_steps` GROUP BY state

-- inventory.steps_with_key
SELECT scope, `key`, seq, name, fingerprint, state, claim_token, output, updated_at, expires_at, (TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) AS db_now FROM `idem_records_steps` WHERE `key` = ? ORDER BY scope, seq

-- entity.find
SELECT * FROM `payments` WHERE `idempotency_token` = ?

-- entity.insert
INSERT INTO `payments` (`idempotency_token`, `amount_cents`, `status`) VALUES (?, ?, ?)

-- entity.upsert ["idempotency_token"]
INSERT INTO `payments` (`idempotency_token`, `amount_cents`, `status`) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE `amount_cents` = VALUES(`amount_cents`), `status` = VALUES(`status`)

-- entity.upserted ["idempotency_token"]
SELECT * FROM `payments` WHERE `idempotency_token` = ?

-- entity.upsert ["idempotency_token", "amount_cents", "status"]
INSERT INTO `payments` (`idempotency_token`, `amount_cents`, `status`) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE `idempotency_token` = VALUES(`idempotency_token`)

-- entity.upserted ["idempotency_token", "amount_cents", "status"]
SELECT * FROM `payments` WHERE `idempotency_token` = ? AND `amount_cents` = ? AND `status` = ?

-- entity.upsert ["amount_cents", "status"]
INSERT INTO `payments` (`idempotency_token`, `amount_cents`, `status`) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE `idempotency_token` = VALUES(`idempotency_token`)

-- entity.upserted ["amount_cents", "status"]
SELECT * FROM `payments` WHERE `amount_cents` = ? AND `status` = ?

