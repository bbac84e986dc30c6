#!/bin/bash
echo robot > /workspace/todo.txt
