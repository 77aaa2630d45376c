// Package tooldef renders the functions the fleet serves as the tool
// definitions an agent platform takes (Agents function tools, Assistants
// functions, Responses functions), each with the team whose words it
// holds. The dispatcher command's tools command, GET /v1/tools (package
// httpapi) and the demo use it; it reads nothing itself: pass it the
// specs of [dispatch.Functions] or [dispatch.Dispatcher.ServedFunctions].
package tooldef
