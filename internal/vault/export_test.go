package vault

// SetAfterCommit sets what runs after a push is committed to the store
// (nil: nothing), for the tests of a crash at that moment.
func SetAfterCommit(s *Service, f func() error) { s.afterCommit = f }
