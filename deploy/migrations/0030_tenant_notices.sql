-- What the platform tells a tenant's admins (issue 40: a webhook endpoint disabled after
-- sustained failure, "and the owner told"): one notice per occasion, kept, listed to the
-- tenant's admins (`GET /notices`, `geofence webhook notices`), and pushed to each admin's
-- registered devices (device_token) once it is stored (fence/webhooks/notices.py). The notice is written
-- in the transaction that made the occasion (the endpoint's disable), so it is never lost; a
-- crash between that commit and the push leaves it stored with `pushed` 0.
CREATE TABLE tenant_notice (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,
    kind        text NOT NULL CHECK (kind ~ '^[a-z][a-z_.]{0,63}$'),
    subject     text NOT NULL CHECK (length(subject) BETWEEN 1 AND 200),  -- what it is about (an endpoint id)
    title       text NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    body        text NOT NULL CHECK (length(body) <= 2000),
    pushed      integer NOT NULL DEFAULT 0,     -- admins' devices it reached (sent, or logged as local)
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX tenant_notice_by_tenant ON tenant_notice (tenant, id);
