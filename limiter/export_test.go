package limiter

// ScriptCalls is how many script calls l's pipeline has sent; 0 without pipelining.
// Tests check with it that the counts of one key, or of one org, in a round share one
// call.
func ScriptCalls(l *Redis) uint64 {
	if l.pipe == nil {
		return 0
	}
	return l.pipe.calls.Load()
}

// ScriptHashes are the SHA1s of the scripts Prepare loads.
func ScriptHashes() []string {
	return []string{countScript.Hash(), clockScript.Hash()}
}
