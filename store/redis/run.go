package redis

import (
	"context"
	_ "embed"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// run runs a script on key, waiting for WaitReplicas replicas when wait is
// set and the store has them.
func (r *Store) run(ctx context.Context, s luaScript, key string, wait bool, args ...any) (any, error) {
	return r.runKeys(ctx, s, []string{key}, wait, args...)
}

// runKeys is run on several keys, all in one slot, the first naming it.
func (r *Store) runKeys(ctx context.Context, s luaScript, keys []string, wait bool, args ...any) (any, error) {
	switch {
	case r.pipeline != nil:
		return r.runPipelined(ctx, s, keys, args)
	case wait && r.waitReplicas > 0:
		return r.runWaiting(ctx, s, keys, args)
	default:
		return s.Run(ctx, r.c, keys, args...).Result()
	}
}

// waitShortfall is the error of a script that ran on the primary but that
// fewer replicas than WaitReplicas acknowledged.
type waitShortfall struct {
	acked int64
	want  int
	cause error // WAIT's own error, if it failed
}

func (e *waitShortfall) Error() string {
	return fmt.Sprintf("%v: redis write acknowledged by %d of the %d replicas waited for (%v)",
		idemproxy.ErrUnavailable, e.acked, e.want, e.cause)
}

func (e *waitShortfall) Unwrap() error { return idemproxy.ErrUnavailable }

// runWaiting sends the script and WAIT down one connection, so that WAIT
// counts the replicas that have the script's writes. When fewer
// acknowledge it than WaitReplicas it returns the script's reply with a
// *waitShortfall.
func (r *Store) runWaiting(ctx context.Context, s luaScript, keys []string, args []any) (any, error) {
	node := goredis.Cmdable(r.c)
	if r.cluster != nil {
		c, err := r.cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		node = c
	}
	send := func(whole bool) (any, error) {
		var eval, acked *goredis.Cmd
		_, err := node.Pipelined(ctx, func(p goredis.Pipeliner) error {
			if whole {
				eval = s.Eval(ctx, p, keys, args...)
			} else {
				eval = s.EvalSha(ctx, p, keys, args...)
			}
			acked = p.Do(ctx, "WAIT", r.waitReplicas, (r.opTimeout / 2).Milliseconds())
			return nil
		})
		v, evalErr := eval.Result()
		if evalErr != nil {
			return nil, evalErr
		}
		if err != nil {
			return nil, err
		}
		if n, err := acked.Int64(); err != nil || n < int64(r.waitReplicas) {
			return v, &waitShortfall{acked: n, want: r.waitReplicas, cause: err}
		}
		return v, nil
	}
	v, err := send(false)
	if goredis.HasErrorPrefix(err, "NOSCRIPT") {
		// Not in the server's cache (after SCRIPT FLUSH or a failover):
		// send it whole.
		return send(true)
	}
	return v, err
}

// runPipelined runs a script on the autopipeliner, waiting for its reply
// until ctx ends.
func (r *Store) runPipelined(ctx context.Context, s luaScript, keys []string, args []any) (any, error) {
	send := func(verb, script string) (any, error) {
		cmdArgs := make([]any, 0, 3+len(keys)+len(args))
		cmdArgs = append(cmdArgs, verb, script, len(keys))
		for _, k := range keys {
			cmdArgs = append(cmdArgs, k)
		}
		cmd := goredis.NewCmd(ctx, append(cmdArgs, args...)...)
		if err := r.pipeline.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil {
			return nil, err
		}
		return cmd.Result()
	}
	v, err := send("evalsha", s.Hash())
	if goredis.HasErrorPrefix(err, "NOSCRIPT") {
		return send("eval", s.src)
	}
	return v, err
}
