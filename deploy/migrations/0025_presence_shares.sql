-- Cross-tenant presence (exchanges/fence_options/shares.py): a tenant shares the presence of
-- its objects with another tenant, whose fences may then count them (a fence's counts_from),
-- as counts only, never identities. Both sides opt in: this row is the objects' tenant's
-- consent (its admin's), counts_from the fences' tenant's choice; a row removed takes the
-- tenant off every such fence (fence/service.py).
CREATE TABLE presence_share (
    tenant      text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,  -- whose objects are counted
    to_tenant   text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,  -- whose fences count them
    granted_by  text NOT NULL CHECK (length(granted_by) BETWEEN 1 AND 128),
    granted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, to_tenant),
    CHECK (tenant <> to_tenant)
);
CREATE INDEX presence_share_to ON presence_share (to_tenant);
