-- Where a region's vhost lives when it is not on the pipeline's own RabbitMQ (a second node,
-- another host): x-ingress and the fence service connect there with their own users, and
-- the region's federation upstream reads from there (`geofence region add --broker 2`,
-- deploy/region_ops.py). A region without a row is on the first node.
CREATE TABLE region_broker (
    region  text PRIMARY KEY,
    host    text NOT NULL,
    port    integer NOT NULL CHECK (port BETWEEN 1 AND 65535)
);
