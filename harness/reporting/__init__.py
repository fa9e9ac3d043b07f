"""What a run's ledgers say, read back: the report (`report`, `report_render`, `report_diff`,
`report_verdict`, `repeats`), `harness elo` (`elo`, `elo_data`, `elo_games`, `elo_fit`, `elo_render`),
`harness status` (`status`) and the headline figures every view shares (`figures`). These
modules read ledgers and run folders; none decides, trains or writes a row."""
