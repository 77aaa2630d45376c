package main

import "context"

func curveReplicas(ctx context.Context, cfg config, c *curve) error { return nil }
func curveCluster(ctx context.Context, cfg config, c *curve) error  { return nil }
func curveMCP(ctx context.Context, cfg config, c *curve) error      { return nil }
