"""The Postgres commit function (a group of commits applied in one statement) and lock step.

``harness_commit_group(table, commits)`` does on the server what ``portable.apply_group`` does
with SQLAlchemy: take the table's row lock, run each commit's checks (idempotent commit id,
locks and fencing token, sources present, compare-and-set, adds), and write each commit that
passes as its own version. A commit that fails a check writes nothing and is reported as
``{"error": code, ...details}`` (worded by ``errors.check_failed``); its neighbours still
apply. Called as one statement on an autocommit connection, a commit costs one round trip.
Commits that change the schema go through the portable applier (schema evolution is Python).

Installed by catalog migration 2; a change here needs a new migration, never an edit of a
released one.
"""

COMMIT_FUNCTION_V1 = r"""
CREATE OR REPLACE FUNCTION harness_commit_one(
    t harness_tables, c jsonb, cur bigint, p_schema int, p_at double precision,
    now_ts double precision
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    cid text := c->>'commit_id';
    lid text := c->>'lock_id';
    done record;
    mine record;
    l record;
    u jsonb;
    a jsonb;
    n text;
    sid int;
    sv bigint;
    touched text[];
    overlap text[];
    bad text[];
    v bigint := cur + 1;
BEGIN
    SELECT hv.version, hv.schema_id INTO done FROM harness_versions hv
     WHERE hv.table_id = t.id AND hv.commit_id = cid;
    IF FOUND THEN
        RETURN jsonb_build_object('version', done.version, 'applied', false,
                                  'schema_id', done.schema_id);
    END IF;
    touched := ARRAY(SELECT x->>'source' FROM jsonb_array_elements(c->'updates') x)
            || ARRAY(SELECT jsonb_array_elements_text(c->'removes'));
    -- Locks: the commit's own must be live with a current token; no one else's may cover it.
    IF lid IS NOT NULL THEN
        SELECT hl.fencing_token INTO mine FROM harness_locks hl
         WHERE hl.lock_id = lid AND hl.table_id = t.id AND hl.granted AND hl.expires_at > now_ts;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('error', 'lock_gone', 'lock_id', lid);
        END IF;
        IF c->'fencing_token' <> 'null'::jsonb
           AND (c->>'fencing_token')::bigint <> mine.fencing_token THEN
            RETURN jsonb_build_object('error', 'lock_stale', 'lock_id', lid,
                'token', (c->>'fencing_token')::bigint, 'current', mine.fencing_token);
        END IF;
    END IF;
    FOR l IN SELECT hl.owner, hl.sources FROM harness_locks hl
              WHERE hl.table_id = t.id AND hl.granted AND hl.expires_at > now_ts
                AND hl.lock_id IS DISTINCT FROM lid LOOP
        overlap := ARRAY(SELECT x FROM json_array_elements_text(l.sources) x
                          WHERE x = ANY(touched));
        IF cardinality(overlap) > 0 THEN
            RETURN jsonb_build_object('error', 'locked', 'sources', to_jsonb(overlap),
                                      'owner', l.owner);
        END IF;
    END LOOP;
    FOREACH n IN ARRAY touched LOOP
        PERFORM 1 FROM harness_sources s
          WHERE s.table_id = t.id AND s.name = n AND s.removed_version IS NULL;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('error', 'no_source', 'source', n);
        END IF;
    END LOOP;
    -- Compare-and-set against the state in force now: the source's latest state row.
    FOR u IN SELECT * FROM jsonb_array_elements(c->'updates') LOOP
        CONTINUE WHEN u->'expect' = 'null'::jsonb;
        SELECT st.state_version INTO sv FROM harness_sources s
          JOIN harness_source_states st ON st.source_id = s.id
         WHERE s.table_id = t.id AND s.name = u->>'source' AND s.removed_version IS NULL
         ORDER BY st.version DESC LIMIT 1;
        IF sv <> (u->>'expect')::bigint THEN
            RETURN jsonb_build_object('error', 'cas', 'source', u->>'source',
                                      'current', sv, 'expected', (u->>'expect')::bigint);
        END IF;
    END LOOP;
    FOR a IN SELECT * FROM jsonb_array_elements(c->'adds') LOOP
        PERFORM 1 FROM harness_sources s
          WHERE s.table_id = t.id AND s.name = a->>'name' AND s.removed_version IS NULL;
        IF FOUND THEN
            RETURN jsonb_build_object('error', 'source_exists', 'source', a->>'name');
        END IF;
        bad := ARRAY(SELECT k FROM jsonb_object_keys(a->'partition') k
                      WHERE NOT (t.partition_by::jsonb ? k));
        IF cardinality(bad) > 0 THEN
            RETURN jsonb_build_object('error', 'bad_partition', 'source', a->>'name',
                                      'keys', to_jsonb(bad), 'partition_by', t.partition_by::jsonb);
        END IF;
    END LOOP;
    -- Every check passed: write the version.
    INSERT INTO harness_versions (table_id, version, committed_at, commit_id, schema_id, summary)
    VALUES (t.id, v, p_at, cid, p_schema, (c->'summary')::json);
    FOR a IN SELECT * FROM jsonb_array_elements(c->'adds') LOOP
        INSERT INTO harness_sources (table_id, name, kind, config, "partition", added_version)
        VALUES (t.id, a->>'name', a->>'kind', (a->'config')::json, (a->'partition')::json, v)
        RETURNING id INTO sid;
        INSERT INTO harness_source_states (source_id, version, state, state_version)
        VALUES (sid, v, (a->'state')::json, 1);
    END LOOP;
    FOR u IN SELECT * FROM jsonb_array_elements(c->'updates') LOOP
        SELECT s.id INTO sid FROM harness_sources s
         WHERE s.table_id = t.id AND s.name = u->>'source' AND s.removed_version IS NULL;
        INSERT INTO harness_source_states (source_id, version, state, state_version)
        SELECT sid, v, (u->'state')::json, st.state_version + 1
          FROM harness_source_states st WHERE st.source_id = sid
         ORDER BY st.version DESC LIMIT 1;
    END LOOP;
    UPDATE harness_sources s SET removed_version = v
     WHERE s.table_id = t.id AND s.removed_version IS NULL
       AND s.name IN (SELECT jsonb_array_elements_text(c->'removes'));
    INSERT INTO harness_kv (table_id, ns, key, version, value)
    SELECT t.id, x->>'ns', x->>'key', v,
           CASE WHEN x->'value' = 'null'::jsonb THEN NULL ELSE (x->'value')::json END
      FROM jsonb_array_elements(c->'kv') x;
    RETURN jsonb_build_object('version', v, 'applied', true, 'schema_id', p_schema);
END
$fn$;

CREATE OR REPLACE FUNCTION harness_commit_group(p_table text, p_commits jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    t harness_tables;
    now_ts double precision := extract(epoch FROM clock_timestamp());
    commit_at double precision;
    cur bigint;
    sch int;
    c jsonb;
    res jsonb;
    outcomes jsonb := '[]'::jsonb;
BEGIN
    SELECT * INTO t FROM harness_tables WHERE name = p_table FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('error', 'no_table');
    END IF;
    cur := t.current_version;
    SELECT hv.schema_id, greatest(now_ts, hv.committed_at) INTO sch, commit_at
      FROM harness_versions hv WHERE hv.table_id = t.id AND hv.version = cur;
    FOR c IN SELECT * FROM jsonb_array_elements(p_commits) LOOP
        res := harness_commit_one(t, c, cur, sch, commit_at, now_ts);
        IF (res->>'applied')::boolean THEN
            cur := cur + 1;
        END IF;
        outcomes := outcomes || jsonb_build_array(res);
    END LOOP;
    IF cur <> t.current_version THEN
        UPDATE harness_tables SET current_version = cur WHERE id = t.id;
    END IF;
    RETURN outcomes;
END
$fn$;
"""

LOCK_FUNCTION_V1 = r"""
CREATE OR REPLACE FUNCTION harness_lock_step(
    p_table text, p_lock_id text, p_owner text, p_sources jsonb, p_ttl double precision,
    p_enqueue boolean, p_heartbeat double precision
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    t harness_tables;
    now_ts double precision := extract(epoch FROM clock_timestamp());
    wanted text[] := ARRAY(SELECT jsonb_array_elements_text(p_sources));
    missing text[];
    mine record;
    blockers text[];
    token bigint;
BEGIN
    SELECT * INTO t FROM harness_tables WHERE name = p_table FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('error', 'no_table');
    END IF;
    DELETE FROM harness_locks hl WHERE hl.table_id = t.id AND hl.expires_at <= now_ts;
    missing := ARRAY(SELECT w FROM unnest(wanted) w WHERE NOT EXISTS (
        SELECT 1 FROM harness_sources s
         WHERE s.table_id = t.id AND s.name = w AND s.removed_version IS NULL) ORDER BY w);
    IF cardinality(missing) > 0 THEN
        RETURN jsonb_build_object('missing', to_jsonb(missing));
    END IF;
    SELECT hl.seq INTO mine FROM harness_locks hl WHERE hl.lock_id = p_lock_id;
    -- Overlapping holders, and waiters queued before this request: nobody overtakes them.
    blockers := ARRAY(
        SELECT DISTINCT hl.owner || CASE WHEN hl.granted THEN ' (holds)' ELSE ' (waits)' END
          FROM harness_locks hl
         WHERE hl.table_id = t.id AND hl.lock_id <> p_lock_id
           AND EXISTS (SELECT 1 FROM json_array_elements_text(hl.sources) x
                        WHERE x = ANY(wanted))
           AND (hl.granted OR mine.seq IS NULL OR hl.seq < mine.seq));
    IF cardinality(blockers) = 0 THEN
        token := t.next_fencing_token;
        UPDATE harness_tables SET next_fencing_token = token + 1 WHERE id = t.id;
        IF mine.seq IS NOT NULL THEN
            UPDATE harness_locks SET granted = true, fencing_token = token,
                   expires_at = now_ts + p_ttl, ttl_s = p_ttl
             WHERE lock_id = p_lock_id;
        ELSE
            INSERT INTO harness_locks (lock_id, table_id, owner, sources, granted,
                                       fencing_token, expires_at, ttl_s)
            VALUES (p_lock_id, t.id, p_owner, p_sources::json, true, token,
                    now_ts + p_ttl, p_ttl);
        END IF;
        RETURN jsonb_build_object('token', token, 'expires_at', now_ts + p_ttl);
    END IF;
    IF p_enqueue THEN
        IF mine.seq IS NOT NULL THEN
            UPDATE harness_locks SET expires_at = now_ts + p_heartbeat
             WHERE lock_id = p_lock_id;
        ELSE
            INSERT INTO harness_locks (lock_id, table_id, owner, sources, granted,
                                       expires_at, ttl_s)
            VALUES (p_lock_id, t.id, p_owner, p_sources::json, false,
                    now_ts + p_heartbeat, p_ttl);
        END IF;
    END IF;
    RETURN jsonb_build_object('blockers', to_jsonb(ARRAY(SELECT unnest(blockers) ORDER BY 1)));
END
$fn$;
"""

#: ``locks.step``'s queue in one statement: a waiting request holds its place in the queue of
#: each of its sources, in name order (bytewise, as Python sorts them), up to and including
#: the first one held or reserved by a request ahead of it; V1 made it hold every source.
LOCK_FUNCTION_V2 = r"""
CREATE OR REPLACE FUNCTION harness_lock_step(
    p_table text, p_lock_id text, p_owner text, p_sources jsonb, p_ttl double precision,
    p_enqueue boolean, p_heartbeat double precision
) RETURNS jsonb LANGUAGE plpgsql AS $fn$
DECLARE
    t harness_tables;
    now_ts double precision := extract(epoch FROM clock_timestamp());
    wanted text[] := ARRAY(SELECT jsonb_array_elements_text(p_sources));
    missing text[];
    mine record;
    blockers text[];
    taken text[];
    claim text[];
    waiter record;
    v_source text;
    token bigint;
BEGIN
    SELECT * INTO t FROM harness_tables WHERE name = p_table FOR UPDATE;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('error', 'no_table');
    END IF;
    DELETE FROM harness_locks hl WHERE hl.table_id = t.id AND hl.expires_at <= now_ts;
    missing := ARRAY(SELECT w FROM unnest(wanted) w WHERE NOT EXISTS (
        SELECT 1 FROM harness_sources s
         WHERE s.table_id = t.id AND s.name = w AND s.removed_version IS NULL) ORDER BY w);
    IF cardinality(missing) > 0 THEN
        RETURN jsonb_build_object('missing', to_jsonb(missing));
    END IF;
    SELECT hl.seq INTO mine FROM harness_locks hl WHERE hl.lock_id = p_lock_id;
    -- Holders keep all of their sources.
    blockers := ARRAY(
        SELECT DISTINCT hl.owner || ' (holds)'
          FROM harness_locks hl
         WHERE hl.table_id = t.id AND hl.lock_id <> p_lock_id AND hl.granted
           AND EXISTS (SELECT 1 FROM json_array_elements_text(hl.sources) x
                        WHERE x = ANY(wanted)));
    taken := ARRAY(
        SELECT DISTINCT x FROM harness_locks hl, json_array_elements_text(hl.sources) x
         WHERE hl.table_id = t.id AND hl.lock_id <> p_lock_id AND hl.granted);
    -- Waiters queued ahead keep the sources they reached: up to the first one taken.
    FOR waiter IN
        SELECT hl.owner, ARRAY(SELECT x FROM json_array_elements_text(hl.sources) x
                                ORDER BY x COLLATE "C") AS names
          FROM harness_locks hl
         WHERE hl.table_id = t.id AND hl.lock_id <> p_lock_id AND NOT hl.granted
           AND (mine.seq IS NULL OR hl.seq < mine.seq)
         ORDER BY hl.seq
    LOOP
        claim := '{}';
        FOREACH v_source IN ARRAY waiter.names LOOP
            claim := claim || v_source;
            EXIT WHEN v_source = ANY(taken);
        END LOOP;
        IF claim && wanted THEN
            blockers := blockers || (waiter.owner || ' (waits)');
        END IF;
        taken := taken || claim;
    END LOOP;
    blockers := ARRAY(SELECT DISTINCT b FROM unnest(blockers) b);
    IF cardinality(blockers) = 0 THEN
        token := t.next_fencing_token;
        UPDATE harness_tables SET next_fencing_token = token + 1 WHERE id = t.id;
        IF mine.seq IS NOT NULL THEN
            UPDATE harness_locks SET granted = true, fencing_token = token,
                   expires_at = now_ts + p_ttl, ttl_s = p_ttl
             WHERE lock_id = p_lock_id;
        ELSE
            INSERT INTO harness_locks (lock_id, table_id, owner, sources, granted,
                                       fencing_token, expires_at, ttl_s)
            VALUES (p_lock_id, t.id, p_owner, p_sources::json, true, token,
                    now_ts + p_ttl, p_ttl);
        END IF;
        RETURN jsonb_build_object('token', token, 'expires_at', now_ts + p_ttl);
    END IF;
    IF p_enqueue THEN
        IF mine.seq IS NOT NULL THEN
            UPDATE harness_locks SET expires_at = now_ts + p_heartbeat
             WHERE lock_id = p_lock_id;
        ELSE
            INSERT INTO harness_locks (lock_id, table_id, owner, sources, granted,
                                       expires_at, ttl_s)
            VALUES (p_lock_id, t.id, p_owner, p_sources::json, false,
                    now_ts + p_heartbeat, p_ttl);
        END IF;
    END IF;
    RETURN jsonb_build_object('blockers', to_jsonb(ARRAY(SELECT unnest(blockers) ORDER BY 1)));
END
$fn$;
"""
