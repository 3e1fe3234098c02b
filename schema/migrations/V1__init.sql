-- Fenced inventory allocator: initial schema.
--
-- PostgreSQL is the only authority. Leases, epochs, inventory, reservations and the ledger live in
-- one database so that the fence check and the stock change commit in one transaction.

-- One row: the partition count is chosen when the cluster is initialised and never changes,
-- because the SKU -> partition mapping (stable_hash(sku) mod P) is stored on every inventory row.
CREATE TABLE cluster_settings (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    partition_count integer NOT NULL CHECK (partition_count BETWEEN 1 AND 4096),
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Every change of ownership (acquire, release, takeover) takes a new value from this sequence so
-- routers can order the assignment map and detect gaps.
CREATE SEQUENCE assignment_revision AS bigint START 1;

-- One row per lease name ('partition/17', 'job/settlement'). Expiry is judged only by the
-- database clock (now()); epoch strictly increases on every acquisition.
CREATE TABLE leases (
    name        text PRIMARY KEY,
    partition   integer UNIQUE,
    holder_id   text,
    holder_url  text,
    epoch       bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    revision    bigint NOT NULL DEFAULT 0,
    acquired_at timestamptz,
    renewed_at  timestamptz,
    expires_at  timestamptz,
    transitions bigint NOT NULL DEFAULT 0
);

-- An epoch may never go backwards, whoever writes the lease row.
CREATE FUNCTION leases_epoch_monotonic() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.epoch < OLD.epoch THEN
        RAISE EXCEPTION 'lease % epoch may not decrease (% -> %)', OLD.name, OLD.epoch, NEW.epoch
            USING ERRCODE = 'FA002';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER leases_epoch_monotonic BEFORE UPDATE ON leases
    FOR EACH ROW EXECUTE FUNCTION leases_epoch_monotonic();

-- Live replicas heartbeat here; each aims for ceil(P / live replicas) partitions.
CREATE TABLE replicas (
    replica_id    text PRIMARY KEY,
    advertise_url text NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

CREATE TABLE inventory (
    sku           text PRIMARY KEY CHECK (sku ~ '^[A-Za-z0-9._:-]{1,64}$'),
    partition     integer NOT NULL CHECK (partition >= 0),
    on_hand       bigint NOT NULL CHECK (on_hand >= 0),
    -- I1: no writer, however buggy, can make available stock negative.
    available     bigint NOT NULL CHECK (available >= 0),
    held          bigint NOT NULL DEFAULT 0 CHECK (held >= 0),
    confirmed     bigint NOT NULL DEFAULT 0 CHECK (confirmed >= 0),
    -- The highest lease epoch that wrote this row; a lower epoch is refused by the trigger below.
    highest_epoch bigint NOT NULL CHECK (highest_epoch >= 1),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inventory_balance CHECK (on_hand = available + held + confirmed)
);
CREATE INDEX inventory_partition ON inventory (partition);

-- Resource-side fence: a row that epoch e+1 wrote can never again be written by epoch <= e.
CREATE FUNCTION inventory_epoch_fence() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.highest_epoch < OLD.highest_epoch THEN
        RAISE EXCEPTION 'stale epoch % for sku % (row epoch %)', NEW.highest_epoch, OLD.sku, OLD.highest_epoch
            USING ERRCODE = 'FA001';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END $$;
CREATE TRIGGER inventory_epoch_fence BEFORE UPDATE ON inventory
    FOR EACH ROW EXECUTE FUNCTION inventory_epoch_fence();

-- One row per reservation id, including durable refusals ('rejected' = out of stock), so a
-- retry with the same id always gets the original outcome.
CREATE TABLE reservations (
    reservation_id      text PRIMARY KEY CHECK (length(reservation_id) BETWEEN 1 AND 255),
    -- Deferred: the reservation row is inserted first so that its unique id decides races
    -- between owners of different partitions; an unknown SKU deletes it again before commit.
    sku                 text NOT NULL REFERENCES inventory (sku) DEFERRABLE INITIALLY DEFERRED,
    partition           integer NOT NULL,
    quantity            bigint NOT NULL CHECK (quantity > 0),
    status              text NOT NULL CHECK (status IN ('held', 'confirmed', 'released', 'expired', 'rejected')),
    -- Epoch of the owner that wrote the latest transition.
    epoch               bigint NOT NULL,
    ttl_seconds         integer NOT NULL,
    -- sku + quantity + ttl of the original request: a reuse with another payload is refused (422).
    request_fingerprint text NOT NULL,
    -- For 'rejected': how much was available when the request was refused.
    available_at_refusal bigint,
    expires_at          timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reservations_held_expiry ON reservations (partition, expires_at) WHERE status = 'held';

CREATE TABLE adjustments (
    adjustment_id text PRIMARY KEY CHECK (length(adjustment_id) BETWEEN 1 AND 255),
    sku           text NOT NULL,
    partition     integer NOT NULL,
    delta         bigint NOT NULL CHECK (delta <> 0),
    status        text NOT NULL CHECK (status IN ('applied', 'refused')),
    epoch         bigint NOT NULL,
    on_hand_after   bigint,
    available_after bigint,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Append-only record of every stock movement; summing the deltas per SKU reproduces the row.
CREATE TABLE ledger (
    entry_id       bigserial PRIMARY KEY,
    sku            text NOT NULL REFERENCES inventory (sku),
    partition      integer NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('reserve', 'confirm', 'release', 'expire', 'restock', 'shrink')),
    reservation_id text REFERENCES reservations (reservation_id),
    adjustment_id  text REFERENCES adjustments (adjustment_id),
    d_on_hand      bigint NOT NULL,
    d_available    bigint NOT NULL,
    d_held         bigint NOT NULL,
    d_confirmed    bigint NOT NULL,
    epoch          bigint NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    CHECK ((reservation_id IS NULL) <> (adjustment_id IS NULL))
);
CREATE INDEX ledger_sku ON ledger (sku);

CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'ledger is append-only' USING ERRCODE = 'FA003';
END $$;
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
