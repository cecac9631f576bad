package memory

// HeldVisits reports how many references of the held keys' index, and
// entries behind them, the listings of held keys have read.
func HeldVisits(m *Store) int64 { return m.held.visits.Load() }
