package layers

// SnapshotDirForTest exposes where snapshot id lives to the external tests.
func (s *Store) SnapshotDirForTest(id string) string { return s.snapshotDir(id) }

// BtrfsSysfs exposes the sysfs directory of the filesystem holding dir.
var BtrfsSysfs = btrfsSysfs
