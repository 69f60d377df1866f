-- The database's clock (a schedule's next ticks are shown from it).
SELECT now()
