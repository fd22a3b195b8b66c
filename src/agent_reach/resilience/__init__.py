"""Failure handling: timeouts and deadlines now; retry budgets, breakers and health next."""
