package conns

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds the process's view of its dependencies, which keygate_health
// answers from: the breakers of every v1_gateway handler of every loaded config, by
// dependency. It is package-level because it has to be: keygate_health is a module of
// its own, and during a reload the old config's handlers and the new one's are loaded
// together.

// watched is the breakers Watch was given, by dependency: by its name and the key of
// its connections.
var watched = struct {
	mu   sync.Mutex
	deps map[[2]string]*watchedDep
}{deps: map[[2]string]*watchedDep{}}

// watchedDep is one dependency of the process: one PostgreSQL or Redis. It lives
// while it has breakers. During a reload the new config's breakers are watched before
// the old config's are taken out, so the new ones start from what the old ones knew.
type watchedDep struct {
	breakers map[*Breaker]struct{} // guarded by watched.mu
	last     atomic.Int32          // the upState any of its breakers heard last
}

// Unwatch takes a breaker out of the process's view: Watch returns it. Destruct
// calls it, so that a usage pool of the caller's can hold it.
type Unwatch func()

// Destruct takes the breaker out.
func (u Unwatch) Destruct() error {
	u()
	return nil
}

// Watch adds b, a breaker of the dependency named name ("postgres", "redis"), to the
// process's view, and returns the function that takes it out. key tells one
// PostgreSQL or Redis from another: its URL and connection settings, say. A breaker
// that has heard nothing starts from what the breakers of the same key heard last;
// one of a key not watched yet pings it at once, so that the first health check
// finds it known. Set b's Ping and OnUp first. Once taken out, b reports nothing more,
// to OnUp either.
func Watch(name, key string, b *Breaker) Unwatch {
	id := [2]string{name, key}
	watched.mu.Lock()
	d := watched.deps[id]
	if d == nil {
		d = &watchedDep{breakers: map[*Breaker]struct{}{}}
		watched.deps[id] = d
	}
	d.breakers[b] = struct{}{}
	watched.mu.Unlock()

	b.mu.Lock()
	b.watched = d
	if last := upState(d.last.Load()); b.up == upUnknown && last != upUnknown {
		b.setUp(last == upYes)
	}
	known := b.up != upUnknown
	b.mu.Unlock()
	if !known {
		b.Check(0)
	}
	return func() {
		watched.mu.Lock()
		delete(d.breakers, b)
		if len(d.breakers) == 0 && watched.deps[id] == d {
			delete(watched.deps, id)
		}
		watched.mu.Unlock()
		// A call, probe or ping still under way says nothing for the process once
		// b's handler is gone: its pool may be closing.
		b.mu.Lock()
		b.watched, b.OnUp = nil, nil
		b.mu.Unlock()
	}
}

// Health reports the dependencies of the process that are down, sorted, each once: one
// of whose watched breakers is not Up. Each breaker Checks itself on the way, with
// every as the least time between pings of an idle dependency. watching is false
// when no breaker is watched: the process has no v1_gateway handler loaded.
func Health(every time.Duration) (down []string, watching bool) {
	type entry struct {
		name string
		b    *Breaker
	}
	var all []entry
	watched.mu.Lock()
	for id, d := range watched.deps {
		for b := range d.breakers {
			all = append(all, entry{id[0], b})
		}
	}
	watched.mu.Unlock()
	// The breakers are checked without watched.mu: a breaker reports to its
	// dependency with its own lock held.
	for _, e := range all {
		if !e.b.Check(every) && !slices.Contains(down, e.name) {
			down = append(down, e.name)
		}
	}
	slices.Sort(down)
	return down, len(all) > 0
}
