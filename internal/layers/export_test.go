package layers

// SnapshotDirForTest exposes where snapshot id lives to the external tests.
func (s *Store) SnapshotDirForTest(id string) string { return s.snapshotDir(id) }

// BtrfsSysfs exposes the sysfs directory of the filesystem holding dir.
var BtrfsSysfs = btrfsSysfs

// SparesForTest is how many emptied writable layers are kept for reuse.
func (s *Store) SparesForTest() int {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	return len(s.spares)
}
