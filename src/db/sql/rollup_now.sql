-- The database's clock in epoch minutes (the charts' last minute).
SELECT (extract(epoch FROM now())::int8 / 60)
