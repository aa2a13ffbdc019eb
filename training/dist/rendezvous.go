package dist

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// IDBytes is the size of the token rank 0 hands out (an ncclUniqueId).
const IDBytes = 128

var hello = [8]byte{'r', 'p', 'a', 'c', 'r', 'd', 'v', '1'}

// Rendezvous meets the job's ranks at e.Addr: rank 0 listens there,
// waits until every other rank has said hello (with the same number of
// ranks, each rank once), makes the id with makeID and sends it to each;
// the other ranks dial until rank 0 answers. Every rank returns the id.
// It fails when the ranks have not met within timeout, naming the ranks
// that did not come.
func Rendezvous(ctx context.Context, e Env, makeID func() ([IDBytes]byte, error), timeout time.Duration) ([IDBytes]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if e.Rank == 0 {
		return serve(ctx, e, makeID)
	}
	return join(ctx, e)
}

func serve(ctx context.Context, e Env, makeID func() ([IDBytes]byte, error)) ([IDBytes]byte, error) {
	var id [IDBytes]byte
	_, port, err := net.SplitHostPort(e.Addr)
	if err != nil {
		return id, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", ":"+port)
	if err != nil {
		return id, fmt.Errorf("rendezvous: rank 0 cannot listen on port %s (MASTER_PORT): %w", port, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conns := map[int]net.Conn{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for len(conns) < e.World-1 {
		c, err := ln.Accept()
		if err != nil {
			return id, fmt.Errorf("rendezvous at %s: %d of %d ranks came within the time (missing ranks %v): %w",
				e.Addr, len(conns)+1, e.World, missing(conns, e.World), context.Cause(ctx))
		}
		rank, err := readHello(ctx, c, e.World)
		if err == nil && conns[rank] != nil {
			err = fmt.Errorf("rank %d said hello twice (two processes with one RANK?)", rank)
		}
		if err != nil {
			c.Close()
			return id, fmt.Errorf("rendezvous at %s: %w", e.Addr, err)
		}
		conns[rank] = c
	}
	if id, err = makeID(); err != nil {
		return id, err
	}
	for r, c := range conns {
		c.SetWriteDeadline(deadline(ctx))
		if _, err := c.Write(id[:]); err != nil {
			return id, fmt.Errorf("rendezvous: sending the id to rank %d: %w", r, err)
		}
	}
	return id, nil
}

func missing(conns map[int]net.Conn, world int) []int {
	var out []int
	for r := 1; r < world; r++ {
		if conns[r] == nil {
			out = append(out, r)
		}
	}
	return out
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// readHello reads a rank's hello: the magic, its number of ranks and its
// rank.
func readHello(ctx context.Context, c net.Conn, world int) (int, error) {
	c.SetReadDeadline(deadline(ctx))
	var b [16]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return 0, fmt.Errorf("a connection from %s said no hello: %w", c.RemoteAddr(), err)
	}
	if [8]byte(b[:8]) != hello {
		return 0, fmt.Errorf("a connection from %s is not an rpac rank (MASTER_PORT taken by another program?)", c.RemoteAddr())
	}
	w, r := int(binary.BigEndian.Uint32(b[8:])), int(binary.BigEndian.Uint32(b[12:]))
	if w != world {
		return 0, fmt.Errorf("rank %d (%s) says the job has %d ranks, rank 0 says %d", r, c.RemoteAddr(), w, world)
	}
	if r < 1 || r >= world {
		return 0, fmt.Errorf("a connection from %s says it is rank %d of %d", c.RemoteAddr(), r, world)
	}
	return r, nil
}

func join(ctx context.Context, e Env) ([IDBytes]byte, error) {
	var id [IDBytes]byte
	var d net.Dialer
	var c net.Conn
	var err error
	for {
		if c, err = d.DialContext(ctx, "tcp", e.Addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return id, fmt.Errorf("rendezvous: rank %d could not reach rank 0 at %s (MASTER_ADDR:MASTER_PORT) within the time: %w", e.Rank, e.Addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer c.Close()
	var b [16]byte
	copy(b[:], hello[:])
	binary.BigEndian.PutUint32(b[8:], uint32(e.World))
	binary.BigEndian.PutUint32(b[12:], uint32(e.Rank))
	c.SetDeadline(deadline(ctx))
	if _, err := c.Write(b[:]); err != nil {
		return id, fmt.Errorf("rendezvous: rank %d: %w", e.Rank, err)
	}
	if _, err := io.ReadFull(c, id[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return id, fmt.Errorf("rendezvous: rank 0 at %s closed the connection before sending the id (see rank 0's error)", e.Addr)
		}
		return id, fmt.Errorf("rendezvous: rank %d waiting for the id from %s: %w", e.Rank, e.Addr, err)
	}
	return id, nil
}
