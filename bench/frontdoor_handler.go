//go:build dispatchhandler

package main

import (
	"net/http"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// frontDoor is the dispatcher's HTTP front door, served by the
// dispatcher itself in the commits before pkg/dispatch/httpapi.
func frontDoor(d *dispatch.Dispatcher) http.Handler { return d.Handler() }
