// Package conformance holds the test that the wire contract is enough: an
// executor written from docs/protocol.md on pkg/protocol and nats.go alone,
// without pkg/exec or any internal package that applies the contract, as a
// team in another language would write it, runs calls for the real
// dispatcher end to end.
package conformance
