package serve

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// crowdedHeaderTimeout is how long a connection may go without finishing
// its request's headers once the listener is full: past it, it is closed to
// make room (the read header timeout still bounds it otherwise).
const crowdedHeaderTimeout = time.Second

// evictRetry is how often a full listener looks again for a connection to
// close while none can be.
const evictRetry = 100 * time.Millisecond

// connLimits are the bounds of a limitedListener.
type connLimits struct {
	max       int           // connections open at once (0: unbounded)
	perClient int           // connections open at once from one remote IP (0: unbounded)
	header    time.Duration // crowdedHeaderTimeout, or a shorter read header timeout
}

// limitListener returns a listener that holds at most l.max connections
// open at once, and at most l.perClient from one remote IP (one more is
// closed as soon as it is accepted). When it is full, Accept closes a
// connection that holds a place for nothing: an idle keep-alive one (the
// longest idle first), else one that has not finished its headers within
// l.header (the oldest first); failing both it waits (the kernel's backlog
// holds the rest) until one closes or becomes one of those. The connections'
// states come from the http.Server's ConnState hook, which must be set to
// the listener's track method.
func limitListener(ln net.Listener, l connLimits) *limitedListener {
	ll := &limitedListener{Listener: ln, lim: l, done: make(chan struct{}),
		open: map[*trackedConn]struct{}{}, perIP: map[string]int{}}
	if l.max > 0 {
		ll.sem = make(chan struct{}, l.max)
	}
	return ll
}

type limitedListener struct {
	net.Listener
	lim       connLimits
	sem       chan struct{} // one token per open connection; nil: unbounded
	closeOnce sync.Once
	done      chan struct{} // closed by Close: Accept stops waiting

	mu    sync.Mutex
	open  map[*trackedConn]struct{}
	perIP map[string]int
}

// trackedConn is an accepted connection, with its state as the http.Server
// last reported it. It gives its place back once, when it is first closed.
type trackedConn struct {
	net.Conn
	ln    *limitedListener
	ip    string
	once  sync.Once
	state http.ConnState // guarded by ln.mu
	since time.Time      // when it entered state; guarded by ln.mu
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.ln.release(c) })
	return err
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		if err := l.acquire(); err != nil {
			return nil, err
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.give()
			return nil, err
		}
		if tc := l.admit(c); tc != nil {
			return tc, nil
		}
		c.Close()
		l.give()
	}
}

// acquire takes a place, closing a connection that holds one for nothing
// while there is none.
func (l *limitedListener) acquire() error {
	if l.sem == nil {
		return nil
	}
	for {
		select {
		case l.sem <- struct{}{}:
			return nil
		default:
		}
		l.evict()
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-l.done:
			return net.ErrClosed
		case <-time.After(evictRetry):
		}
	}
}

// give returns a place taken by acquire.
func (l *limitedListener) give() {
	if l.sem != nil {
		<-l.sem
	}
}

// admit registers c, or returns nil when its remote IP holds its share of
// connections already.
func (l *limitedListener) admit(c net.Conn) *trackedConn {
	ip := remoteIP(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.perClient > 0 && l.perIP[ip] >= l.lim.perClient {
		return nil
	}
	l.perIP[ip]++
	tc := &trackedConn{Conn: c, ln: l, ip: ip, state: http.StateNew, since: time.Now()}
	l.open[tc] = struct{}{}
	return tc
}

// release forgets c and gives its place back.
func (l *limitedListener) release(c *trackedConn) {
	l.mu.Lock()
	delete(l.open, c)
	if l.perIP[c.ip]--; l.perIP[c.ip] <= 0 {
		delete(l.perIP, c.ip)
	}
	l.mu.Unlock()
	l.give()
}

// track is the http.Server's ConnState hook: it records each connection's
// state and since when.
func (l *limitedListener) track(c net.Conn, s http.ConnState) {
	tc, ok := c.(*trackedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	tc.state, tc.since = s, time.Now()
	l.mu.Unlock()
}

// evict closes the connection that holds a place for nothing the longest,
// if there is one.
func (l *limitedListener) evict() {
	now := time.Now()
	var idle, slow *trackedConn
	l.mu.Lock()
	for c := range l.open {
		switch {
		case c.state == http.StateIdle && (idle == nil || c.since.Before(idle.since)):
			idle = c
		case c.state == http.StateNew && now.Sub(c.since) > l.lim.header && (slow == nil || c.since.Before(slow.since)):
			slow = c
		}
	}
	l.mu.Unlock()
	if idle != nil {
		idle.Close()
	} else if slow != nil {
		slow.Close()
	}
}

func (l *limitedListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// remoteIP is the host part of c's remote address (the whole address when
// it has none).
func remoteIP(c net.Conn) string {
	a := c.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}
