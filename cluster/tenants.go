package cluster

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/isolation"
)

// tenantsKey is the key of the cluster's quota file.
const tenantsKey = "tenants"

// TenantsSource names the quota file kept in etcd in messages, as a path
// names one on disk.
const TenantsSource = "etcd:tenants"

// PutTenants validates a quota file (isolation.Parse) and stores it as the
// cluster's. An invalid file changes nothing and fails with every mistake
// it has (api.ErrInvalidArgument); it returns the stored configuration.
func (s *Session) PutTenants(ctx context.Context, data []byte) (*isolation.Config, error) {
	if len(data) > isolation.MaxQuotaFile {
		return nil, fmt.Errorf("quota file of %d bytes: at most %d: %w", len(data), isolation.MaxQuotaFile, api.ErrInvalidArgument)
	}
	cfg, err := isolation.Parse(TenantsSource, data)
	if err != nil {
		return nil, err
	}
	if _, err := s.cli.Put(ctx, s.key(tenantsKey), string(data)); err != nil {
		return nil, s.unavailable("store the quota file", err)
	}
	return cfg, nil
}

// WatchTenants calls fn with the cluster's quota file now, and again each
// time it changes, until ctx ends. present is false while etcd has none;
// err is set, and cfg nil, for a stored file that fails validation (stored
// by hand, or by an older version): the caller keeps its current quotas.
func (s *Session) WatchTenants(ctx context.Context, fn func(cfg *isolation.Config, present bool, err error)) {
	key := s.key(tenantsKey)
	deliver := func(v []byte, present bool) {
		if !present {
			fn(nil, false, nil)
			return
		}
		cfg, err := isolation.Parse(TenantsSource, v)
		fn(cfg, true, err)
	}
	for ctx.Err() == nil {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			s.log.WithError(err).Warn("cluster: reading the quota file failed; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if len(resp.Kvs) > 0 {
			deliver(resp.Kvs[0].Value, true)
		} else {
			deliver(nil, false)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for w := range until(ctx, s.cli.Watch(wctx, key, clientv3.WithRev(resp.Header.Revision+1))) {
			if w.Err() != nil {
				s.log.WithError(w.Err()).Warn("cluster: the quota file's watch broke; reading it again")
				break
			}
			for _, ev := range w.Events {
				deliver(ev.Kv.Value, ev.Type != clientv3.EventTypeDelete)
			}
		}
		cancel()
	}
}
