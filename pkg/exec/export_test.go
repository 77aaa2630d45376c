package exec

// CheckServerURLs is, for tests, the check Connect makes of its URL list.
var CheckServerURLs = checkServerURLs
