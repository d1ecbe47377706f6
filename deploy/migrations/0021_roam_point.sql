-- Proximity subscriptions on a fixed point (issue 20; exchanges/subscriptions.py): the point,
-- NULL for a subscription that follows an object. object_id holds the synthetic subscriber
-- "@<id>" of a point's subscription.
ALTER TABLE roam_subscription ADD COLUMN point_lon double precision, ADD COLUMN point_lat double precision;
ALTER TABLE roam_subscription ADD CONSTRAINT roam_subscription_point_check
    CHECK ((point_lon IS NULL) = (point_lat IS NULL)
           AND (point_lon IS NULL OR (point_lon BETWEEN -180 AND 180 AND point_lat BETWEEN -90 AND 90)));
