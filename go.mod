module github.com/ferryml/ferry

go 1.26
