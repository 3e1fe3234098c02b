-- Multi-line orders placed through the routers.
--
-- An order's lines are reservations on several partitions, decided by the router that took the
-- request. Two submissions of one order id (a client retry racing the original, or the same order
-- sent to two routers) must not decide it twice: one could answer "placed" for holds the other
-- releases. The router therefore locks this row (SELECT ... FOR UPDATE) for as long as it works
-- on the order, and stores the final answer here; every later submission replays it.
CREATE TABLE orders (
    order_id        text PRIMARY KEY CHECK (length(order_id) BETWEEN 1 AND 200),
    -- The request as first submitted ({lines, ttl_seconds}); a reuse with other lines is refused.
    request         jsonb NOT NULL,
    -- 'pending': not decided yet (never run to the end, or the last attempt's outcome was
    -- unknown); the next submission runs the order again with the same line ids.
    -- 'placed' / 'failed' / 'refused': final, replayed verbatim from response_status/response.
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'placed', 'failed', 'refused')),
    response_status smallint CHECK (response_status BETWEEN 200 AND 599),
    response        jsonb,
    -- Submissions that ran the protocol (including ones whose outcome was unknown).
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((status = 'pending') = (response IS NULL)),
    CHECK ((response IS NULL) = (response_status IS NULL))
);
