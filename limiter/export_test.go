package limiter

// ScriptCalls is how many script calls l's pipeline has sent; 0 without pipelining.
// Tests check with it that the counts of one key in a round share one call.
func ScriptCalls(l *Redis) uint64 {
	if l.pipe == nil {
		return 0
	}
	return l.pipe.calls.Load()
}

// ScriptHashes are the SHA1s of the scripts Prepare loads.
func ScriptHashes() []string {
	return []string{incrScript.Hash(), clockScript.Hash(), budgetScript.Hash()}
}

// BudgetScriptCalls is how many script calls l's pipeline has sent for AllowBudgets;
// 0 without pipelining.
func BudgetScriptCalls(l *Redis) uint64 {
	if l.budgets == nil {
		return 0
	}
	return l.budgets.calls.Load()
}
