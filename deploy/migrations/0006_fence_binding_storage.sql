-- fence_binding's coverings (sorted uint64 pairs) are rewritten whole every night. pglz
-- shrinks them 2.1x but the server spends 3.5x longer writing them (100,000 real coverings:
-- 6.2 s compressed, 1.8 s not; 203 MB against 435 MB); lz4 does not shrink them at all. So
-- they are stored out of line without compression: the nightly job's time is what counts,
-- the disk space is small. Existing rows keep their form until the next run replaces them.
ALTER TABLE fence_binding
    ALTER COLUMN ranges SET STORAGE EXTERNAL,
    ALTER COLUMN interior SET STORAGE EXTERNAL;
