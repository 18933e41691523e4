"""`fox sweep`: seeds x configs of `fox train` as Ray tasks (spec, driver, runner, folder, aggregate)."""
